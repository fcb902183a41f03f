#!/usr/bin/env bash
# install-packages.sh: install the distribution packages of the base image (RDMA user space, SSH,
# Open MPI, build tools, Python) from packages.txt, pinned for the release this runs on, and prepare
# sshd for MPI / DeepSpeed launches. The Dockerfile runs it as root during the build:
#
#   bash install-packages.sh /opt/dist-train/packages.txt
#   INSTALL_OPENMPI=1 bash install-packages.sh packages.txt     # Open MPI even beside HPC-X's
#   DRY_RUN=1 bash install-packages.sh packages.txt             # print the apt-get command only
#   OS_RELEASE=/path/os-release DRY_RUN=1 bash install-packages.sh packages.txt   # as another release
#
# What the base already has from dpkg is kept as it is (an NGC image's rdma-core or openssh is never
# up- or downgraded). SSH host keys are removed again: they are made per container by start-sshd.
set -euo pipefail

TABLE=${1:-/opt/dist-train/packages.txt}
INSTALL_OPENMPI=${INSTALL_OPENMPI:-auto}   # auto: only when no mpirun is on PATH; 1: always; 0: never
DRY_RUN=${DRY_RUN:-0}
OS_RELEASE=${OS_RELEASE:-/etc/os-release}
export DEBIAN_FRONTEND=noninteractive

die() { echo "install-packages.sh: error: $*" >&2; exit 1; }
log() { echo "install-packages.sh: $*"; }

[ -r "$TABLE" ] || die "no package table at $TABLE"
[ -r "$OS_RELEASE" ] || die "$OS_RELEASE is missing: not a Debian/Ubuntu base image"
# shellcheck disable=SC1090
. "$OS_RELEASE"
release=${VERSION_CODENAME:-}
releases=$(awk '!/^#/ && NF { $1 = ""; print; exit }' "$TABLE")
col=$(awk -v r="$release" '!/^#/ && NF { for (i = 2; i <= NF; i++) if ($i == r) print i; exit }' "$TABLE")
[ -n "$col" ] || die "release '${release}' (${PRETTY_NAME:-unknown}) has no column in $TABLE (columns:${releases}); add one with the package names and versions of that release"
command -v apt-get >/dev/null || die "apt-get is missing: the base must be Debian or Ubuntu"

case "$INSTALL_OPENMPI" in auto | 0 | 1) ;; *) die "INSTALL_OPENMPI must be auto, 0 or 1, not '$INSTALL_OPENMPI'" ;; esac

# Which groups of the table this image needs (see the header of packages.txt).
wanted_group() {
  case "$1" in
    rdma | ssh) return 0 ;;
    mpi)
      [ "$INSTALL_OPENMPI" = 1 ] && return 0
      [ "$INSTALL_OPENMPI" = 0 ] && return 1
      if command -v mpirun >/dev/null; then
        log "keeping the base's MPI: $(command -v mpirun) (INSTALL_OPENMPI=1 adds Debian's Open MPI anyway)"
        return 1
      fi
      return 0 ;;
    build) ! { command -v make && command -v g++ && command -v git; } >/dev/null ;;
    python) ! command -v python3 >/dev/null ;;
    *) die "unknown group '$1' in $TABLE" ;;
  esac
}

installed_version() { { dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null || true; } | awk '$3 == "installed" { print $4 }'; }

declare -A wanted=()
install=()
kept=()
while read -r group spec; do
  [[ "$spec" == *=* ]] || die "'$spec' in $TABLE has no =version pin"
  if [ -z "${wanted[$group]:-}" ]; then
    if wanted_group "$group"; then wanted[$group]=yes; else wanted[$group]=no; fi
  fi
  [ "${wanted[$group]}" = yes ] || continue
  name=${spec%%=*}
  have=$(installed_version "$name")
  if [ -n "$have" ]; then
    kept+=("$name=$have")
  else
    install+=("$spec")
  fi
done < <(awk -v c="$col" '!/^#/ && NF && !header++ { next } !/^#/ && NF { print $1, $c }' "$TABLE")

log "release ${release}: installing ${install[*]:-nothing}"
[ ${#kept[@]} -eq 0 ] || log "kept from the base image: ${kept[*]}"
if [ "$DRY_RUN" = 1 ]; then
  echo "apt-get install -y --no-install-recommends ${install[*]}"
  exit 0
fi

if [ ${#install[@]} -gt 0 ]; then
  apt-get update
  apt-get install -y --no-install-recommends "${install[@]}"
fi

if [ -x /usr/sbin/sshd ]; then
  # A private host key in the image would be shared by every container made from it.
  rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
  # pam_loginuid cannot write /proc/self/loginuid without CAP_AUDIT_CONTROL (the container default):
  # as "required" it closes every SSH session right after login.
  if [ -f /etc/pam.d/sshd ]; then
    sed -i -E 's/^(session[[:space:]]+)required([[:space:]]+pam_loginuid\.so)/\1optional\2/' /etc/pam.d/sshd
  fi
  grep -Eq '^Include[[:space:]]+/etc/ssh/sshd_config\.d/\*\.conf' /etc/ssh/sshd_config \
    || die "/etc/ssh/sshd_config does not include sshd_config.d/*.conf; the image's sshd settings would be ignored"
fi
install -d -m 0700 /root/.ssh

apt-get clean
rm -rf /var/lib/apt/lists/*
log "done"
