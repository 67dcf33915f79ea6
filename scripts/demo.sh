#!/usr/bin/env bash
# Set everything up, bring up a local lab of 2 real SSH hosts (network namespaces, needs
# root), run a real 2-host training job on it with multihost, and tear the lab down.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MH=".venv/bin/multihost"
NAME="mhdemo"
trap '"$MH" lab down --name "$NAME" >/dev/null 2>&1 || true' EXIT
"$MH" lab up 2 --name "$NAME"
# Run a shell line as the lab's controller; $MULTIHOST_LAB_DIR/hosts.ini lists the hosts.
as_controller() { "$MH" lab exec --name "$NAME" -- sh -c "$1"; }

echo; echo "== multihost exec: one command on every host =="
as_controller 'multihost exec --hostfile "$MULTIHOST_LAB_DIR/hosts.ini" -- hostname' 

echo; echo "== multihost check: is this cluster ready? =="
as_controller 'multihost check --hostfile "$MULTIHOST_LAB_DIR/hosts.ini" --nproc_per_node 2'

echo; echo "== multihost run: a real 2-host x 2-process DDP training (torchrun, gloo) =="
as_controller 'multihost run --hostfile "$MULTIHOST_LAB_DIR/hosts.ini" --nproc_per_node 2 \
  --code examples -- train_ddp.py --epochs 2'

echo; echo "== multihost logs: rank 0's last lines, from the controller's mirror =="
as_controller 'multihost logs --rank 0 --tail 3'
