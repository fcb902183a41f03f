#!/usr/bin/env bash
# System packages the platform tests launch for real: Slurm (two slurmd on this host), munge,
# OpenMPI, podman + a local registry + debootstrap (image builds). Installs what is missing with apt (needs root, as in CI); otherwise says what to install.
set -euo pipefail

need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v pdsh >/dev/null || need+=(pdsh)   # DeepSpeed's default multi-node launcher (tests/test_deepspeed_launcher.py)
command -v ssh >/dev/null || need+=(openssh-client)
command -v podman >/dev/null || need+=(podman)
command -v buildah >/dev/null || need+=(buildah)
command -v runc >/dev/null || need+=(runc)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing system packages for the platform tests: ${need[*]}" >&2
  echo "install them (Debian/Ubuntu: sudo apt-get install -y ${need[*]}) and run again" >&2
  exit 1
fi
echo "installing ${need[*]} ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
