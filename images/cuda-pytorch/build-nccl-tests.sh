#!/usr/bin/env bash
# build-nccl-tests.sh: build NVIDIA's nccl-tests (all_reduce_perf, all_gather_perf, ...) with MPI
# support against the very NCCL library this image's torch loads, and install the binaries into
# $PREFIX/bin. A bandwidth measured with another NCCL than training uses would prove nothing.
#
#   NCCL_TESTS_REF=v2.13.12 bash build-nccl-tests.sh          # a tag or a full commit hash
#   NCCL_TESTS_URL=https://git.example.com/mirror/nccl-tests.git NCCL_TESTS_REF=v2.13.12 bash build-nccl-tests.sh
#   NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" bash build-nccl-tests.sh   # H100 only: faster build
#   NCCL_TESTS_REF=none bash build-nccl-tests.sh              # skip (stand-in bases without CUDA)
#
# Needs: nvcc under CUDA_HOME (a CUDA devel base; NGC images have it), mpicc on PATH, git, python3
# with torch. Which NCCL: the libnccl.so.2 that torch has loaded (NGC: the system's, in
# /usr/lib/x86_64-linux-gnu; pip torch: the nvidia-nccl wheel's), with the nccl.h beside it. The
# binaries get a RUNPATH to that library and to the MPI library of the mpirun on PATH, and the build
# fails if they would load any other.
set -euo pipefail

NCCL_TESTS_REF=${NCCL_TESTS_REF:-v2.13.12}
NCCL_TESTS_URL=${NCCL_TESTS_URL:-https://github.com/NVIDIA/nccl-tests.git}
PREFIX=${PREFIX:-/opt/nccl-tests}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC_GENCODE=${NVCC_GENCODE:-}

die() { echo "build-nccl-tests.sh: error: $*" >&2; exit 1; }
log() { echo "build-nccl-tests.sh: $*"; }

if [ "$NCCL_TESTS_REF" = none ]; then
  log "NCCL_TESTS_REF=none: not building nccl-tests"
  exit 0
fi
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc at $CUDA_HOME/bin/nvcc: nccl-tests needs a CUDA devel base (NGC, nvidia/cuda:*-devel-*), or set NCCL_TESTS_REF=none"
command -v mpicc >/dev/null || die "no mpicc on PATH: build with INSTALL_OPENMPI=1, or set NCCL_TESTS_REF=none"
command -v git >/dev/null || die "no git on PATH"

# The NCCL that torch loads: ncclGetVersion() needs no GPU, and afterwards the library is mapped.
nccl_lib=$(python3 - <<'EOF'
import torch
try:
    torch.cuda.nccl.version()
except Exception:
    pass
paths = {line.split()[-1] for line in open("/proc/self/maps") if "libnccl.so" in line}
print(" ".join(sorted(paths)))
EOF
)
case "$nccl_lib" in
  "") die "torch ($(python3 -c 'import torch; print(torch.__version__)')) loads no libnccl.so (a CPU build, or NCCL linked statically): no NCCL to test against" ;;
  *" "*) die "torch maps several NCCL libraries: $nccl_lib" ;;
esac
nccl_lib=$(readlink -f "$nccl_lib")
nccl_libdir=$(dirname "$nccl_lib")
nccl_inc=
for dir in "$(dirname "$nccl_libdir")/include" /usr/include "$CUDA_HOME/include"; do
  if [ -f "$dir/nccl.h" ]; then nccl_inc=$dir; break; fi
done
[ -n "$nccl_inc" ] || die "no nccl.h for $nccl_lib (looked beside it, in /usr/include and $CUDA_HOME/include): install the NCCL headers of that version (libnccl-dev)"
lib_version=$(python3 -c 'import torch; v = torch.cuda.nccl.version(); print(".".join(map(str, v)) if isinstance(v, tuple) else v)')
hdr_version=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{ printf "%s%s", sep, $3; sep = "." }' "$nccl_inc/nccl.h")
[ "$hdr_version" = "$lib_version" ] || log "warning: $nccl_inc/nccl.h is NCCL $hdr_version, the library torch loads is $lib_version"
log "NCCL $lib_version: $nccl_lib (headers $nccl_inc)"

# nccl-tests takes NCCL_HOME and MPI_HOME as prefixes with include/ and lib/; both libraries live
# elsewhere (Debian's Open MPI under /usr/lib/x86_64-linux-gnu/openmpi, HPC-X under /opt/hpcx, the
# NCCL wheel has no unversioned libnccl.so), so link prefixes are made for them here.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/nccl/lib" "$work/mpi"
ln -s "$nccl_inc" "$work/nccl/include"
ln -s "$nccl_lib" "$work/nccl/lib/libnccl.so"
read -r -a mpi_incdirs <<<"$(mpicc --showme:incdirs)"
read -r -a mpi_libdirs <<<"$(mpicc --showme:libdirs)"
mpi_inc=
for dir in "${mpi_incdirs[@]}"; do
  if [ -f "$dir/mpi.h" ]; then mpi_inc=$dir; break; fi
done
mpi_libdir=
for dir in "${mpi_libdirs[@]}"; do
  if compgen -G "$dir/libmpi.so*" >/dev/null; then mpi_libdir=$dir; break; fi
done
[ -n "$mpi_inc" ] && [ -n "$mpi_libdir" ] || die "mpicc ($(command -v mpicc)) names no directory with mpi.h and libmpi.so (an Open MPI wrapper is expected)"
ln -s "$mpi_inc" "$work/mpi/include"
ln -s "$mpi_libdir" "$work/mpi/lib"
log "MPI: $(command -v mpirun || echo 'no mpirun') (headers $mpi_inc, library $mpi_libdir)"

git -c advice.detachedHead=false clone --quiet --no-checkout "$NCCL_TESTS_URL" "$work/src" \
  || die "cannot clone $NCCL_TESTS_URL (set NCCL_TESTS_URL to a reachable mirror)"
git -C "$work/src" -c advice.detachedHead=false checkout --quiet "$NCCL_TESTS_REF" \
  || die "no ref '$NCCL_TESTS_REF' in $NCCL_TESTS_URL"
commit=$(git -C "$work/src" rev-parse HEAD)
log "nccl-tests $NCCL_TESTS_REF = $commit"

make_args=(MPI=1 MPI_HOME="$work/mpi" NCCL_HOME="$work/nccl" CUDA_HOME="$CUDA_HOME")
[ -z "$NVCC_GENCODE" ] || make_args+=(NVCC_GENCODE="$NVCC_GENCODE")
# GNU ld records LD_RUN_PATH as the RUNPATH when no -rpath is given: the binaries find exactly
# these libraries before ld.so.cache, whatever else the image holds.
LD_RUN_PATH="$nccl_libdir:$mpi_libdir" make -C "$work/src" -j"$(nproc)" "${make_args[@]}"

install -d "$PREFIX/bin"
install -m 0755 "$work"/src/build/*_perf "$PREFIX/bin/"
printf 'url=%s\nref=%s\ncommit=%s\nnccl=%s\nnccl_library=%s\nmpi_library_dir=%s\n' \
  "$NCCL_TESTS_URL" "$NCCL_TESTS_REF" "$commit" "$lib_version" "$nccl_lib" "$mpi_libdir" >"$PREFIX/BUILD_INFO"

resolved=$({ ldd "$PREFIX/bin/all_reduce_perf" || true; } | awk '$1 ~ /^libnccl\.so/ { print $3 }')
[ -n "$resolved" ] && [ "$(readlink -f "$resolved")" = "$nccl_lib" ] \
  || die "all_reduce_perf loads NCCL from '${resolved:-nowhere}', not $nccl_lib"
log "installed into $PREFIX/bin: $(cd "$PREFIX/bin" && echo *)"
