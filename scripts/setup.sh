#!/usr/bin/env bash
# Set up everything multihost's tests and demo need on a fresh Debian/Ubuntu machine:
# system tools for the namespace lab (apt-get, as root, only what is missing) and a
# virtualenv in .venv with multihost, its test extras and torch (CPU) for the examples.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v ps >/dev/null 2>&1 || need+=(procps)
command -v tmux >/dev/null 2>&1 || need+=(tmux)   # the dashboard tests drive a real terminal
# The Slurm lab (multihost lab up N --slurm) runs real slurmctld/slurmd and munged.
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
# Accounts whose login shell is not bash (the login-shell tests), and sshfs (a shared
# home with a network filesystem's weak semantics).
for shell in zsh tcsh fish; do command -v $shell >/dev/null 2>&1 || need+=($shell); done
command -v sshfs >/dev/null 2>&1 || need+=(sshfs)
# run --image in the lab: podman in every lab host (runc: crun refuses hybrid cgroups),
# its init, and debootstrap to build the test image (no registry is needed).
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need+=(runc)
[ -x /usr/libexec/podman/catatonit ] || [ -x /usr/bin/catatonit ] || need+=(catatonit)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)   # the pull path
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# lightning, transformers and accelerate: the programs of tests/lab/test_programs.py (pinned
# beside torch, so that none of them replaces it)
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' 'torch==2.13.0' numpy \
  'lightning==2.6.6' 'transformers==5.25.0' 'accelerate==1.16.0' 2>&1 \
  | grep -v -e '^WARNING: Location' -e 'is ignored' || true
.venv/bin/python -W ignore -c 'import multihost, paramiko, rich, torch' \
  || { echo "setup: the virtualenv is incomplete" >&2; exit 1; }
echo "setup: ready (.venv)"
