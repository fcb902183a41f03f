#!/usr/bin/env bash
# The GPU throughput bench on a fresh GPU machine, unattended, in one command:
#
#   bash bench/run_gpu_bench.sh                    # every row of bench/gpu_throughput.py (H200 figures: bench/README.md)
#   bash bench/run_gpu_bench.sh --quick            # one row per family and strategy, 20 steps: a GPU lent for minutes
#   bash bench/run_gpu_bench.sh --only bert        # options go to gpu_throughput.py (--steps, --no-compile, ...)
#
# Needs Python 3.10+ with venv and pip, git (copier reads the template with it; the results name the
# template's revision), an NVIDIA driver, and PyPI (or a mirror through pip's usual PIP_INDEX_URL);
# nothing else is downloaded: the corpus is made from the installed packages' text, the models are
# built from configs, and the Hugging Face hub is switched off. Makes a virtual environment
# (GPU_BENCH_VENV, default ~/.cache/dist-train-gpu-bench/venv; reused when it exists), installs
# torch==2.13.0 (PyPI's Linux x86_64 wheel is built with CUDA) and what the generated project needs
# (its pyproject's dependencies, transformers for BERT, DeepSpeed without prebuilt ops), checks that
# torch sees a GPU, runs every row and writes the table (tokens/s, MFU, ratios, goals, versions) to
# bench/results/gpu-<date>.md, with the whole console output beside it (.log). Exits non-zero when a
# row failed (the table is written all the same).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
VENV=${GPU_BENCH_VENV:-$HOME/.cache/dist-train-gpu-bench/venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
DEEPSPEED_SPEC=${DEEPSPEED_SPEC:-deepspeed==0.19.8}

die() {
  echo "run_gpu_bench.sh: $*" >&2
  exit 1
}

command -v "$PYTHON" >/dev/null || die "no $PYTHON on PATH; install Python 3.10+ or set PYTHON=/path/to/python3"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  die "$("$PYTHON" -V 2>&1) is too old; the generated project needs Python 3.10+ (set PYTHON=...)"

command -v git >/dev/null || die "no git on PATH: copier needs it to render the project from this template"

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the virtual environment $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV" ||
    die "could not create a virtual environment with $PYTHON (Debian/Ubuntu: apt-get install python3-venv)"
fi
PY=$VENV/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "installing $TORCH_SPEC and the project's dependencies into $VENV (PyPI)"
# torch first: DeepSpeed's build (below) imports the torch it will run with.
"$PY" -m pip install -q "$TORCH_SPEC" setuptools  # setuptools: DeepSpeed builds without isolation
# The generated project's dependencies (template/pyproject.toml.jinja), its bert extra, and copier
# (with the extension copier.yml loads) to render it.
"$PY" -m pip install -q numpy pyyaml "tokenizers>=0.15" pyarrow tqdm tensorboard "py-spy>=0.3.14" "torchao>=0.14" \
  "transformers>=4.46" "copier>=9.4,<10" "copier-template-extensions>=0.3"
# As the project's deepspeed extra says: no ops built at install (no CUDA toolkit needed), against the
# torch installed above. The project runs DeepSpeed with torch's AdamW, so no op is compiled later either.
DS_BUILD_OPS=0 "$PY" -m pip install -q --no-build-isolation "$DEEPSPEED_SPEC"

cpu_smoke=0
out=""
prev=""
for arg in "$@"; do
  [ "$arg" = "--cpu-smoke" ] && cpu_smoke=1
  [ "$prev" = "--out" ] && out=$arg
  case "$arg" in --out=*) out=${arg#--out=} ;; esac
  prev=$arg
done

if [ "$cpu_smoke" = 0 ]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    if "$PY" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)'; then
      die "$("$PY" -c 'import torch; print(torch.__version__)') is a CPU-only build of torch (a CPU index in pip's configuration, or not Linux x86_64?); install a CUDA build, e.g. TORCH_SPEC='torch==2.13.0' PIP_INDEX_URL=https://download.pytorch.org/whl/cu128 with a fresh GPU_BENCH_VENV"
    fi
    "$PY" -c 'import torch; print(f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees no GPU")' >&2 || true
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi >&2 || true
      die "torch.cuda.is_available() is False: is the driver too old for that CUDA (see nvidia-smi above), or CUDA_VISIBLE_DEVICES empty?"
    fi
    die "torch.cuda.is_available() is False and there is no nvidia-smi: no NVIDIA GPU or driver on this machine"
  fi
  "$PY" -c 'import torch; print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")'
fi

if [ -z "$out" ]; then
  kind=$([ "$cpu_smoke" = 1 ] && echo cpu-smoke || echo gpu)
  out=$HERE/results/$kind-$(date +%Y-%m-%d-%H%M).md
  set -- --out "$out" "$@"
fi
mkdir -p "$(dirname "$out")"
log=${out%.md}.log

# Offline apart from PyPI: nothing may reach the Hugging Face hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
status=0
PATH="$VENV/bin:$PATH" "$PY" -u "$HERE/gpu_throughput.py" "$@" 2>&1 | tee "$log" || status=$?
[ -f "$out" ] || die "no results were written (exit $status); the console output is in $log"
echo
echo "results: $out"
echo "console output: $log"
exit "$status"
