#!/usr/bin/env bash
# The Slurm path of docs/running.md, run for real: a single-node Slurm (munged, slurmctld and
# slurmd, each started here on loopback ports with a configuration of its own and stopped at the
# end) runs a scaled-down copy of that page's sbatch script with 4 tasks; it must exit 0.
# Usage: slurm.sh FERRY_MASTER. Exits 77 (ctest: skipped) where Slurm is not installed, except
# under CI, where it must run.
set -euo pipefail
master=$1
for tool in munged slurmctld slurmd sbatch srun sinfo python3; do
  if ! command -v "$tool" > /dev/null; then
    echo "$tool is not installed (Debian: slurmctld slurmd slurm-client munge)"
    [ -n "${CI:-}" ] && exit 1
    exit 77
  fi
done

work=$(mktemp -d /tmp/ferry-slurm-test.XXXXXX)
cleanup() {
  scancel --quiet --full ferry-unet > /dev/null 2>&1 || true
  for pid_file in slurmd.pid slurmctld.pid munged.pid; do
    [ -f "$work/$pid_file" ] && kill "$(cat "$work/$pid_file")" 2> /dev/null || true
  done
  sleep 1
  for pid_file in slurmd.pid slurmctld.pid munged.pid; do
    [ -f "$work/$pid_file" ] && kill -9 "$(cat "$work/$pid_file")" 2> /dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 2> /dev/null
chmod 600 "$work/munge.key"
munged --force --socket="$work/munge.sock" --key-file="$work/munge.key" \
  --log-file="$work/munged.log" --pid-file="$work/munged.pid" --seed-file="$work/munged.seed"

node=$(hostname -s)
mkdir -p "$work/state" "$work/spool"
cat > "$work/slurm.conf" <<CONF
ClusterName=ferrytest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
CredType=cred/munge
SlurmUser=$(id -un)
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
  sinfo --noheader --states=idle 2> /dev/null | grep -q idle && break
  sleep 0.2
done
sinfo --noheader --states=idle | grep -q idle || {
  echo "the node did not come up"; tail -20 "$work/slurmctld.log" "$work/slurmd.log"; exit 1; }

# The documented script, scaled down: one node, 4 tasks, a small model. MASTER_ADDR and FERRY_IFNAME
# keep every connection on loopback (Slurm's node name may resolve to another address here).
cat > "$work/job.sh" <<JOB
#!/bin/bash
#SBATCH --job-name=ferry-unet
#SBATCH --nodes=1
#SBATCH --ntasks=4
#SBATCH --output=$work/job.out
export MASTER_ADDR=127.0.0.1 FERRY_IFNAME=lo GOMP_SPINCOUNT=10000
srun $master train --model unet-resnet18 --image-size 32 --samples 48 --batch-size 8 \
    --epochs 1 --checkpoint-dir $work/ckpt
JOB
status=0
timeout 200 sbatch --wait "$work/job.sh" || status=$?
cat "$work/job.out" 2> /dev/null || true
[ "$status" -eq 0 ] || { echo "the batch job failed: $status"; tail -20 "$work/slurmd.log"; exit 1; }
grep -q "epoch 1/1: train loss" "$work/job.out" || { echo "no epoch in the job's output"; exit 1; }
grep -q "encoder  worker1" "$work/job.out" || { echo "no stage table"; exit 1; }
[ -e "$work/ckpt/LATEST" ] || { echo "no checkpoint"; exit 1; }
echo "the batch job of 4 tasks trained and exited 0"
