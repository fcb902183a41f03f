#!/usr/bin/env bash
# A Docker-API engine, a real registry and a local base image on this host, for the image build
# tests (`<slug> image build --push` through the docker SDK). No systemd, no public registry.
#
#   bash tests/infra/podman.sh            # start (a second call finds everything up and returns at once)
#   bash tests/infra/podman.sh status     # exit 1 unless the engine and the registry answer
#   bash tests/infra/podman.sh stop       # stop the engine and the registry (images stay cached)
#   bash tests/infra/podman.sh clean      # stop, then delete everything under $PODMAN_TEST_DIR
#   eval "$(bash tests/infra/podman.sh env)"   # DOCKER_HOST and podman's config for this shell
#
# The last line `start` prints is `DOCKER_HOST=unix:///...`.
#   (a) `podman system service` serves the Docker API on a socket; podman's configuration is kept
#       out of /etc: CONTAINERS_STORAGE_CONF (storage here; overlay where this kernel mounts it, else
#       vfs, which copies the whole image for every Dockerfile step: ~1.5 GB a step with a torch
#       base, ~25 GB a build of the project Dockerfile), CONTAINERS_CONF (runc, cgroupfs,
#       file events, ulimits within this host's hard limit), CONTAINERS_REGISTRIES_CONF (the local
#       registry is plain HTTP, so it is marked insecure).
#   (b) Debian's `docker-registry` (distribution 2.8) on $REGISTRY_ADDR with filesystem storage.
#   (c) $BASE_IMAGE, a stand-in for the CUDA/PyTorch base: debootstrap'ed Debian bookworm with
#       python3 + pip and the CPU torch wheel pip installs on this machine, imported into podman.
#       Like an NGC image, its system pip may install packages (no EXTERNALLY-MANAGED marker).
#       Built once (~2 min) and kept until `clean`.
set -euo pipefail

DIR=${PODMAN_TEST_DIR:-/tmp/dtt-podman}
REGISTRY_ADDR=${REGISTRY_ADDR:-127.0.0.1:5000}
BASE_IMAGE=${BASE_IMAGE:-localhost/test-base:bookworm}
SUITE=${SUITE:-bookworm}                       # Debian release of the base (python3.11: cp311 wheels)
TORCH_VERSION=${TORCH_VERSION:-2.13.0}         # pinned: an unpinned torch resolves to a multi-GB CUDA build
PYTHON=${PYTHON:-python3}                      # a python with pip, for `pip download`
CA_BUNDLE=${CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}  # trusted by the base (below)
STORAGE_DRIVER=${STORAGE_DRIVER:-auto}         # overlay | vfs | auto (overlay if it mounts here; an existing store keeps its own)
MIRROR=${MIRROR:-}                             # Debian mirror for debootstrap; empty = the one apt uses here
SOCK=$DIR/podman.sock

export CONTAINERS_STORAGE_CONF=$DIR/conf/storage.conf
export CONTAINERS_CONF=$DIR/conf/containers.conf
export CONTAINERS_REGISTRIES_CONF=$DIR/conf/registries.conf
export DOCKER_HOST=unix://$SOCK

log() { echo "podman.sh: $*" >&2; }
die() { log "$*"; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

engine_up() { curl -fsS --max-time 5 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }
registry_up() { curl -fsS --max-time 5 "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; }

need_tools() {
  local need=()
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || need+=(runc)
  command -v docker-registry >/dev/null || need+=(docker-registry)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v curl >/dev/null || need+=(curl)
  [ ${#need[@]} -eq 0 ] || die "missing ${need[*]}: run tests/infra/install-system.sh (Debian: apt-get install -y ${need[*]})"
}

storage_driver() {
  # A store keeps the driver it was made with (podman refuses a mismatch); a new one probes overlay.
  if [ -d "$DIR/storage/overlay" ]; then echo overlay; return; fi
  if [ -d "$DIR/storage/vfs" ]; then echo vfs; return; fi
  if [ "$STORAGE_DRIVER" != auto ]; then echo "$STORAGE_DRIVER"; return; fi
  local p=$DIR/overlay-probe
  rm -rf "$p"; mkdir -p "$p/lower" "$p/upper" "$p/work" "$p/merged"
  if mount -t overlay overlay -o "lowerdir=$p/lower,upperdir=$p/upper,workdir=$p/work" "$p/merged" 2>/dev/null; then
    umount "$p/merged"; echo overlay
  else
    echo vfs  # e.g. $DIR itself on overlayfs (inside a container), or not root
  fi
  rm -rf "$p"
}

write_config() {
  mkdir -p "$DIR/conf" "$DIR/run" "$DIR/tmp" "$DIR/registry/data"
  local driver
  driver=$(storage_driver)
  mkdir -p "$DIR/storage"
  # nofile above the hard limit makes every container fail with "error setting rlimit type 7".
  local hard nofile
  hard=$(ulimit -Hn)
  if [ "$hard" = unlimited ] || [ "$hard" -gt 65536 ]; then nofile=65536; else nofile=$hard; fi
  cat >"$CONTAINERS_STORAGE_CONF" <<EOF
# podman storage for the image tests (driver chosen by tests/infra/podman.sh)
[storage]
driver = "$driver"
runroot = "$DIR/run"
graphroot = "$DIR/storage"
EOF
  cat >"$CONTAINERS_CONF" <<EOF
# podman engine settings for the image tests; crun fails here, runc works; no systemd
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$DIR/events.log"
tmp_dir = "$DIR/tmp"
EOF
  cat >"$CONTAINERS_REGISTRIES_CONF" <<EOF
# Only fully qualified names; the test registry speaks plain HTTP
unqualified-search-registries = []

[[registry]]
location = "$REGISTRY_ADDR"
insecure = true
EOF
  cat >"$DIR/registry/config.yml" <<EOF
# docker-registry (distribution 2.8) for the image tests
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $DIR/registry/data
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
EOF
}

wait_for() {
  # wait_for NAME CHECK LOG: poll CHECK for up to 30 s
  local i
  for i in $(seq 1 60); do
    if "$2"; then return 0; fi
    sleep 0.5
  done
  tail -n 20 "$3" >&2 || true
  die "$1 did not come up within 30 s (log above: $3)"
}

start_engine() {
  engine_up && return
  rm -f "$SOCK"
  # setsid + redirected streams: the service outlives this script and holds no caller's pipe open.
  # Started in / : it outlives the checkout that started it too, and runc cannot start a container
  # from a service whose working folder was deleted ("write child: broken pipe").
  (cd / && exec setsid podman system service --time=0 "unix://$SOCK" </dev/null >"$DIR/podman.log" 2>&1) &
  echo $! >"$DIR/podman.pid"
  wait_for "podman system service" engine_up "$DIR/podman.log"
  log "engine up: DOCKER_HOST=$DOCKER_HOST"
}

start_registry() {
  registry_up && return
  (cd / && exec setsid docker-registry serve "$DIR/registry/config.yml" </dev/null >"$DIR/registry.log" 2>&1) &
  echo $! >"$DIR/registry.pid"
  wait_for "docker-registry" registry_up "$DIR/registry.log"
  log "registry up: http://$REGISTRY_ADDR"
}

apt_mirror() {
  # The Debian mirror apt uses here (deb822 .sources or one-line sources.list), never security.
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | grep -Eo '(URIs:[[:space:]]*|^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)[a-z]+://[^[:space:]]+' \
    | grep -Eo '[a-z]+://[^[:space:]]+' | grep -v -- '-security' | head -n 1) || true
  echo "${uri:-http://deb.debian.org/debian}"
}

base_recipe() {
  # Changes when this script's recipe for the base changes, so a stale cached base is rebuilt.
  printf '%s\n' "$SUITE" "$TORCH_VERSION" "$(declare -f build_base)" | sha256sum | cut -c1-16
}

build_base() {
  local recipe have
  recipe=$(base_recipe)
  have=$(podman image inspect --format '{{ index .Labels "dtt.recipe" }}' "$BASE_IMAGE" 2>/dev/null || true)
  if [ "$have" = "$recipe" ]; then return; fi
  if [ -n "$have" ]; then podman rmi -f "$BASE_IMAGE" >/dev/null 2>&1 || true; fi
  local rootfs=$DIR/base-rootfs wheels=$DIR/wheels mirror=${MIRROR:-$(apt_mirror)} t0=$SECONDS
  [ "$(id -u)" = 0 ] || die "building $BASE_IMAGE needs root (debootstrap, chroot)"
  log "building $BASE_IMAGE: debootstrap $SUITE from $mirror ..."
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates \
    "$SUITE" "$rootfs" "$mirror" >"$DIR/debootstrap.log" 2>&1 \
    || { tail -n 20 "$DIR/debootstrap.log" >&2; die "debootstrap failed (log: $DIR/debootstrap.log)"; }
  # This host's CA bundle: HTTPS from build steps (pip reaching PyPI) may pass a TLS-inspecting
  # proxy that only the host trusts, as a company base image would.
  if [ -s "$CA_BUNDLE" ]; then cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"; fi
  # torch from wherever pip gets it on this machine (a local CPU wheel here), for the base's python.
  log "torch==$TORCH_VERSION for cp311 via pip download ..."
  mkdir -p "$wheels"
  "$PYTHON" -m pip download -d "$wheels" --only-binary=:all: --python-version 3.11 \
    --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
    "torch==$TORCH_VERSION" numpy >"$DIR/pip-download.log" 2>&1 \
    || { tail -n 20 "$DIR/pip-download.log" >&2
         die "pip could not fetch torch==$TORCH_VERSION (cp311, manylinux_2_28_x86_64); set TORCH_VERSION or pip's index"; }
  rm -rf "$rootfs/tmp/wheels"
  cp -r "$wheels" "$rootfs/tmp/wheels"
  # NGC-like: system pip installs into the system python (Debian's PEP 668 marker removed).
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  # A clean environment: this host's PIP_* settings (find-links, constraints) mean nothing inside.
  chroot "$rootfs" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
    python3 -m pip install -q --root-user-action=ignore --no-index --find-links /tmp/wheels \
    --no-cache-dir "torch==$TORCH_VERSION" numpy
  rm -rf "$rootfs/tmp/wheels" "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import \
    --change 'CMD ["python3"]' --change "LABEL dtt.recipe=$recipe" - "$BASE_IMAGE" >"$DIR/import.log" 2>&1 \
    || { tail -n 20 "$DIR/import.log" >&2; die "podman import of $BASE_IMAGE failed"; }
  rm -rf "$rootfs"
  log "$BASE_IMAGE built in $((SECONDS - t0)) s"
}

stop() {
  local f
  for f in "$DIR/podman.pid" "$DIR/registry.pid"; do
    if alive "$f"; then kill "$(cat "$f")" 2>/dev/null || true; fi
    rm -f "$f"
  done
  rm -f "$SOCK"
}

case "${1:-start}" in
  start)
    need_tools
    write_config
    start_registry
    build_base
    start_engine
    echo "DOCKER_HOST=$DOCKER_HOST"
    ;;
  status)
    engine_up || die "engine not answering on $SOCK"
    registry_up || die "registry not answering on $REGISTRY_ADDR"
    echo "DOCKER_HOST=$DOCKER_HOST"
    ;;
  env)
    for v in DOCKER_HOST CONTAINERS_STORAGE_CONF CONTAINERS_CONF CONTAINERS_REGISTRIES_CONF; do
      printf 'export %s=%q\n' "$v" "${!v}"
    done
    ;;
  stop) stop ;;
  clean)
    stop
    if [ -d "$DIR/storage" ]; then podman system reset -f >/dev/null 2>&1 || true; fi
    rm -rf "$DIR"
    ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
