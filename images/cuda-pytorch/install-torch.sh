#!/usr/bin/env bash
# install-torch.sh: make sure the image has PyTorch. With TORCH_PIP_SPEC empty (NGC bases) the base's
# torch is kept, and a base without one fails the build. With TORCH_PIP_SPEC set (plain CUDA bases)
# the pinned wheels are installed from TORCH_INDEX_URL into the virtual environment /opt/venv, which
# the Dockerfile puts first on PATH (Ubuntu 24.04's python refuses system-wide pip installs, PEP 668).
#
#   bash install-torch.sh                                            # keep and check the base's torch
#   TORCH_PIP_SPEC="torch==2.7.1" TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash install-torch.sh
set -euo pipefail

TORCH_PIP_SPEC=${TORCH_PIP_SPEC:-}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
VENV=${VENV:-/opt/venv}

die() { echo "install-torch.sh: error: $*" >&2; exit 1; }

if [ -z "$TORCH_PIP_SPEC" ]; then
  command -v python3 >/dev/null || die "the base image has no python3. For a plain CUDA base pass --build-arg TORCH_PIP_SPEC=torch==X.Y.Z and TORCH_INDEX_URL of its CUDA (README: option B)"
  version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null) \
    || die "the base image's python3 ($(command -v python3)) has no torch. For a plain CUDA base pass --build-arg TORCH_PIP_SPEC=torch==X.Y.Z and TORCH_INDEX_URL of its CUDA (README: option B)"
  echo "install-torch.sh: keeping the base image's torch $version"
  exit 0
fi

if existing=$(/usr/bin/env -u VIRTUAL_ENV python3 -c 'import torch; print(torch.__version__, torch.__file__)' 2>/dev/null); then
  die "the base image already has torch ($existing); TORCH_PIP_SPEC would install a second one beside it. Leave TORCH_PIP_SPEC empty for NGC bases"
fi
read -r -a specs <<<"$TORCH_PIP_SPEC"
for spec in "${specs[@]}"; do
  [[ "$spec" == *==* ]] || die "TORCH_PIP_SPEC entries must be pinned with ==, not '$spec' (an unpinned torch changes under you)"
done
[ -n "$TORCH_INDEX_URL" ] || die "TORCH_PIP_SPEC needs TORCH_INDEX_URL, the index of wheels built for the base's CUDA (e.g. https://download.pytorch.org/whl/cu128)"

python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "${specs[@]}"
"$VENV/bin/python" -c 'import torch; print("install-torch.sh: installed torch", torch.__version__, "for CUDA", torch.version.cuda)'
