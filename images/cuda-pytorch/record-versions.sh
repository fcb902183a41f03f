#!/usr/bin/env bash
# record-versions.sh: write what is really inside the image to /etc/dist-train/base-image.env (a
# file of KEY='value' lines that a shell can source and the project's `doctor` can print), and
# check the versions the Dockerfile puts into its labels against it: a label must not claim a
# CUDA, torch, NCCL or rdma-core that the image does not have.
#
#   bash record-versions.sh                               # as the Dockerfile runs it
#   CUDA_VERSION_LABEL=12.8 TORCH_VERSION_LABEL=2.6 NCCL_VERSION_LABEL=2.25 \
#     RDMA_CORE_VERSION_LABEL=50.0 bash record-versions.sh
#   cat /etc/dist-train/base-image.env                    # in a container of the image
#
# A declared version matches when it is the actual one or a prefix of it up to a dot, dash or plus
# ("2.6" matches 2.6.0a0+ecf3bae40a). "none" declares that the image has no such component.
# VERIFY_LABELS=0 records without checking.
set -euo pipefail

OUT=${OUT:-/etc/dist-train/base-image.env}
VERIFY_LABELS=${VERIFY_LABELS:-1}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

die() { echo "record-versions.sh: error: $*" >&2; exit 1; }

# shellcheck disable=SC1091
. /etc/os-release

torch_info=$(python3 - <<'EOF'
try:
    import torch
except ImportError:
    print("none none none"); raise SystemExit
nccl = "none"
try:
    v = torch.cuda.nccl.version()
    nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception:
    pass
print(torch.__version__, torch.version.cuda or "none", nccl)
EOF
)
read -r torch torch_cuda nccl <<<"$torch_info"
nvcc=none
if [ -x "$CUDA_HOME/bin/nvcc" ]; then
  nvcc=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
fi
pkg_version() { { dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null || true; } | awk '$3 == "installed" { v = $4 } END { print v ? v : "none" }'; }
rdma_core=$(pkg_version rdma-core)
mpi=none
if command -v mpirun >/dev/null; then
  mpi="$(mpirun --version 2>/dev/null | head -n 1) ($(command -v mpirun))"
fi
ssh=none
if command -v ssh >/dev/null; then ssh=$(ssh -V 2>&1); fi
nccl_tests=none
if [ -f /opt/nccl-tests/BUILD_INFO ]; then
  nccl_tests=$(awk -F= '$1 == "ref" { r = $2 } $1 == "commit" { c = $2 } END { print r " (" c ")" }' /opt/nccl-tests/BUILD_INFO)
fi

quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
mkdir -p "$(dirname "$OUT")"
{
  echo "# What is inside this image, recorded when it was built (images/cuda-pytorch/record-versions.sh)."
  echo "BASE_IMAGE=$(quote "${BASE_IMAGE:-unknown}")"
  echo "OS=$(quote "${PRETTY_NAME:-unknown}")"
  echo "CUDA=$(quote "$nvcc")"
  echo "TORCH=$(quote "$torch")"
  echo "TORCH_CUDA=$(quote "$torch_cuda")"
  echo "NCCL=$(quote "$nccl")"
  echo "RDMA_CORE=$(quote "$rdma_core")"
  echo "RDMA_STACK=$(quote "distribution rdma-core user space, no MLNX_OFED (the host's kernel driver does the rest)")"
  echo "MPI=$(quote "$mpi")"
  echo "OPENSSH=$(quote "$ssh")"
  echo "NCCL_TESTS=$(quote "$nccl_tests")"
  echo "PYTHON=$(quote "$(python3 -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>/dev/null || echo none)")"
} >"$OUT"
cat "$OUT"

[ "$VERIFY_LABELS" = 1 ] || exit 0
# matches DECLARED ACTUAL: ACTUAL is DECLARED, or starts with DECLARED followed by . - +
matches() { [ "$2" = "$1" ] || [[ "$2" == "$1".* || "$2" == "$1"-* || "$2" == "$1"+* ]]; }
errors=()
check() {
  local what=$1 arg=$2 declared=$3 actual
  shift 3
  for actual in "$@"; do
    matches "$declared" "$actual" || errors+=("$what: the label says $declared, the image has $actual (--build-arg $arg=...)")
  done
}
check "CUDA (nvcc)" CUDA_VERSION_LABEL "${CUDA_VERSION_LABEL:-none}" "$nvcc"
[ "$torch_cuda" = none ] || check "CUDA (torch)" CUDA_VERSION_LABEL "${CUDA_VERSION_LABEL:-none}" "$torch_cuda"
check "torch" TORCH_VERSION_LABEL "${TORCH_VERSION_LABEL:-none}" "$torch"
check "NCCL" NCCL_VERSION_LABEL "${NCCL_VERSION_LABEL:-none}" "$nccl"
check "rdma-core" RDMA_CORE_VERSION_LABEL "${RDMA_CORE_VERSION_LABEL:-none}" "$rdma_core"
if [ ${#errors[@]} -gt 0 ]; then
  printf 'record-versions.sh: error: %s\n' "${errors[@]}" >&2
  die "the image labels would not say what is inside; pass the versions above as build args (or VERIFY_LABELS=0)"
fi
echo "record-versions.sh: labels match the image"
