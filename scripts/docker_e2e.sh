#!/usr/bin/env bash
# End-to-end check of the Docker deployment: build the images, bring a compose stack up on loopback, run
# the water app over N households (each ClientApp container mounting only its household's file), check the
# results, report time and memory, tear everything down.
#
#   bash scripts/docker_e2e.sh                          # BASE=official (default) pulls flwr/* images
#   BASE=standin bash scripts/docker_e2e.sh             # no registry: a Debian rootfs (debootstrap) + flwr, built here
#   TLS=1 BASE=standin bash scripts/docker_e2e.sh       # with docker/compose.tls.yml: TLS + SuperNode auth
#   ARCH=arm64 BASE=standin bash scripts/docker_e2e.sh  # the households' boxes on linux/arm64 (emulated on x86)
#   NODE_CPUS=1 NODE_MEMORY=512m BASE=standin bash scripts/docker_e2e.sh   # a Pi-sized budget per container
#   NODE_LAYOUT=single NODE_CPUS=1 NODE_MEMORY=512m BASE=standin bash scripts/docker_e2e.sh   # per box
#   NODES=20 ROUNDS=3 BASE=standin bash scripts/docker_e2e.sh              # a fleet of 20 households
#   RECONNECT=1 TLS=1 BASE=standin bash scripts/docker_e2e.sh              # then a frozen box, a SuperLink restart
#   ATTACK=1 BASE=standin bash scripts/docker_e2e.sh                       # then a household that sends sign flips
#
# Variables: BASE (official|standin), TLS (0|1), ARCH (amd64|arm64: the households' SuperNode + ClientApp
# containers; the SuperLink and ServerApp stay on the host's), NODES (households; 3, or 1 with ARCH=arm64),
# ROUNDS (2), ROUND_TIMEOUT (the run's round-timeout, 900 s), NODE_CPUS / NODE_MEMORY (docker limits of each
# household container), NODE_LAYOUT (pair: SuperNode + ClientApp containers; single: one container per
# household, `python -m bouquet.fleet --node-layout single`), NODE_ENV ("NAME=value ..." for every household
# container), ATTACK=1 (after the run: three runs of HK on the same stack, one household's ClientApp sending
# sign-flipped updates in two of them; the robust form must leave it out every round), DAIAD (a DAIAD file; default ../shared/data/daiad/swm_trialA.zip when it exists,
# else synthetic households), REBUILD=1 (rebuild the foreign-architecture app image), RECONNECT=1 (after the
# run: household 0's box paused past the round timeout CUT_TIMEOUT (90 s) and thawed, then the SuperLink
# container killed and restarted mid-run; the nodes must come back unaided and a next run have them all).
# With NODES=3 and no ARCH or limits it runs the committed docker-compose.yml (+ docker/compose.tls.yml);
# otherwise a file from `python -m bouquet.fleet` (tests/test_fleet.py proves the two agree for 3 nodes).
# ARCH=arm64 on an x86 host registers qemu-user-static's aarch64 handler with binfmt_misc for the run only
# and removes it (and the binfmt_misc mount, if it made it) when it ends.
#
# Starts dockerd if none is running and stops what it started (by PID). Network traffic stays on 127.0.0.1
# (host networking, every service bound to 127.0.0.1 on free ports set through the compose files'
# environment variables). Needs: docker (engine + compose), root; BASE=standin: debootstrap; ARCH=arm64 on
# x86: qemu-user-static. Writes to .docker-e2e/ (ignored by git).
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) (the image builders below) stops the script too
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/.docker-e2e
BASE=${BASE:-official}
ARCH=${ARCH:-amd64}
TLS=${TLS:-0}
NODES=${NODES:-$([ "$ARCH" = arm64 ] && echo 1 || echo 3)}
ROUNDS=${ROUNDS:-2}
NODE_CPUS=${NODE_CPUS:-}
NODE_MEMORY=${NODE_MEMORY:-}
NODE_LAYOUT=${NODE_LAYOUT:-pair}
RECONNECT=${RECONNECT:-0}
ATTACK=${ATTACK:-0}
ROUND_TIMEOUT=${ROUND_TIMEOUT:-900}
CUT_TIMEOUT=${CUT_TIMEOUT:-90}
mkdir -p "$WORK"
started=$(date +%s)
log() { echo "[docker-e2e $(( $(date +%s) - started ))s] $*"; }
case "$ARCH" in amd64|arm64) ;; *) echo "ARCH must be amd64 or arm64, got '$ARCH'" >&2; exit 2 ;; esac
case "$BASE" in official|standin) ;; *) echo "BASE must be official or standin, got '$BASE'" >&2; exit 2 ;; esac
case "$NODE_LAYOUT" in pair|single) ;; *) echo "NODE_LAYOUT must be pair or single, got '$NODE_LAYOUT'" >&2; exit 2 ;; esac
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || { echo "NODES must be a positive integer, got '$NODES'" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2; }
[[ "$ROUND_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "ROUND_TIMEOUT must be a positive integer (seconds), got '$ROUND_TIMEOUT'" >&2; exit 2; }
[[ "$CUT_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "CUT_TIMEOUT must be a positive integer (seconds), got '$CUT_TIMEOUT'" >&2; exit 2; }
case "$RECONNECT" in 0|1) ;; *) echo "RECONNECT must be 0 or 1, got '$RECONNECT'" >&2; exit 2 ;; esac
case "$ATTACK" in 0|1) ;; *) echo "ATTACK must be 0 or 1, got '$ATTACK'" >&2; exit 2 ;; esac
if [ "$ATTACK" = 1 ] && [ "$NODES" -lt 3 ]; then echo "ATTACK=1 needs NODES >= 3 (an honest majority around one attacker)" >&2; exit 2; fi
if [ "$RECONNECT" = 1 ] && [ "$NODES" -lt 2 ]; then echo "RECONNECT=1 needs NODES >= 2 (one household is cut off)" >&2; exit 2; fi
HOST_ARCH=$(uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')

DOCKERD_PID="" STATS_PID="" EMU_REGISTERED=0 EMU_MOUNTED=0
BINFMT=/proc/sys/fs/binfmt_misc
cleanup() {
  rc=$?
  if [ -n "$STATS_PID" ]; then kill "$STATS_PID" 2>/dev/null || true; fi
  if [ -n "${box:-}" ]; then docker unpause $box >/dev/null 2>&1 || true; fi   # a frozen box stops too
  if [ -n "${COMPOSE:-}" ]; then $COMPOSE down --remove-orphans >"$WORK/down.log" 2>&1 || true; fi
  if [ "$EMU_REGISTERED" = 1 ]; then log "removing the aarch64 binfmt handler registered for this run"; echo -1 >"$BINFMT/qemu-aarch64" || true; fi
  if [ "$EMU_MOUNTED" = 1 ]; then umount "$BINFMT" || true; fi
  if [ -n "$DOCKERD_PID" ]; then log "stopping the dockerd we started (pid $DOCKERD_PID)"; kill "$DOCKERD_PID" || true; wait "$DOCKERD_PID" 2>/dev/null || true; fi
  exit $rc
}
trap cleanup EXIT INT TERM

if [ "$ARCH" != "$HOST_ARCH" ]; then
  [ "$ARCH" = arm64 ] || { echo "emulation is set up for arm64 boxes on an x86 host only" >&2; exit 2; }
  conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  [ -f "$conf" ] || { echo "ARCH=arm64 on $HOST_ARCH needs qemu-user-static (apt-get install qemu-user-static)" >&2; exit 2; }
  if [ ! -e "$BINFMT/register" ]; then mount -t binfmt_misc binfmt_misc "$BINFMT"; EMU_MOUNTED=1; fi
  if [ ! -e "$BINFMT/qemu-aarch64" ]; then
    cat "$conf" >"$BINFMT/register"   # flag F: the interpreter is opened now, so containers can use it
    EMU_REGISTERED=1
  fi
  log "arm64 emulation: $(head -1 "$BINFMT/qemu-aarch64") ($(sed -n 's/^interpreter //p' "$BINFMT/qemu-aarch64"))"
fi

if ! docker info >/dev/null 2>&1; then
  log "no Docker engine running: starting dockerd"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { log "dockerd did not start; see $WORK/dockerd.log"; exit 1; }
fi
if docker compose version >/dev/null 2>&1; then COMPOSE_BIN="docker compose"; else COMPOSE_BIN="docker-compose"; fi

PY=${PYTHON:-$ROOT/.venv/bin/python}
# This machine's pip trusts a CA bundle that containers do not have (an HTTPS proxy): hand it to the builds.
host_cert=${PIP_CERT:-$("$PY" -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$host_cert" ] && [ -f "$host_cert" ]; then
  cp "$host_cert" docker/extra-ca/ca-bundle.crt
  export PIP_CERT=/tmp/extra-ca/ca-bundle.crt
fi
export BOUQUET_IMAGE=bouquet-fl/superexec:e2e BOUQUET_BUILD_NETWORK=host
USER_TORCH_PIP_ARGS=${TORCH_PIP_ARGS-unset} USER_TORCH_SPEC=${TORCH_SPEC-unset}

# A Debian bookworm rootfs for ARCH as a local image (debootstrap + docker import). `docker import` records
# the daemon's own architecture whatever the files are, so a foreign rootfs gets its image config rewritten
# (docker save -> architecture -> docker load): images built FROM it then say linux/arm64 too.
rootfs_image() {
  local arch=$1 tag=bouquet/debian-rootfs:bookworm${2:-}
  docker image inspect "$tag" >/dev/null 2>&1 && { echo "$tag"; return; }
  log "building a Debian bookworm $arch rootfs with debootstrap (a few minutes, once)" >&2
  rm -rf "$WORK/rootfs-$arch"
  debootstrap --arch="$arch" --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$WORK/rootfs-$arch" http://deb.debian.org/debian >"$WORK/debootstrap-$arch.log" 2>&1
  tar -C "$WORK/rootfs-$arch" -c . | docker import - "$tag" >/dev/null
  rm -rf "$WORK/rootfs-$arch"
  if [ "$arch" != "$HOST_ARCH" ]; then
    rm -rf "$WORK/image-$arch" && mkdir -p "$WORK/image-$arch"
    docker save "$tag" | tar -C "$WORK/image-$arch" -x
    "$PY" - "$WORK/image-$arch" "$arch" <<'PYFIX'
import hashlib, json, os, sys
folder, arch = sys.argv[1], sys.argv[2]
manifest = json.load(open(os.path.join(folder, "manifest.json")))
old = os.path.join(folder, manifest[0]["Config"])
config = json.load(open(old))
config["architecture"] = arch
if arch == "arm64":
    config["variant"] = "v8"
raw = json.dumps(config).encode()
name = hashlib.sha256(raw).hexdigest() + ".json"
open(os.path.join(folder, name), "wb").write(raw)
os.remove(old)
manifest[0]["Config"] = name
json.dump(manifest, open(os.path.join(folder, "manifest.json"), "w"))
PYFIX
    old_id=$(docker image inspect -f '{{.Id}}' "$tag")
    tar -C "$WORK/image-$arch" -c . | docker load >/dev/null
    docker rmi "$old_id" >/dev/null 2>&1 || true
    rm -rf "$WORK/image-$arch"
  fi
  echo "$tag"
}
standin_image() {
  local arch=$1 suffix=${2:-} tag=bouquet/standin-flwr:1.42.0${2:-}
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    local rootfs; rootfs=$(rootfs_image "$arch" "$suffix")
    log "building the stand-in flwr base image ($arch)" >&2
    docker build --network host ${PIP_CERT:+--build-arg PIP_CERT=$PIP_CERT} --build-arg ROOTFS_IMAGE="$rootfs" \
      -t "$tag" -f docker/standin.Dockerfile docker >"$WORK/standin-$arch.log" 2>&1 || { tail -20 "$WORK/standin-$arch.log" >&2; exit 1; }
  fi
  echo "$tag"
}

if [ "$BASE" = standin ]; then
  host_base=$(standin_image "$HOST_ARCH")
  export FLWR_SUPERLINK_IMAGE=$host_base FLWR_SUPERNODE_IMAGE=$host_base BOUQUET_BASE_IMAGE=$host_base
  # the CPU torch wheel pip uses on this machine, copied into the build context (docker/wheels, ignored by git)
  # just before the host's app image is built
  wheel=$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -1 || true)
  if [ -n "$wheel" ]; then
    version=$(basename "$wheel" | cut -d- -f2)   # e.g. 2.13.0+cpu: only the local wheel has that version
    export TORCH_PIP_ARGS="--find-links /tmp/wheels" TORCH_SPEC="torch==$version"
  fi
  export TORCH_PIP_ARGS=${TORCH_PIP_ARGS:---index-url https://download.pytorch.org/whl/cpu}
fi

fleet_args=()
if [ "$ARCH" != "$HOST_ARCH" ]; then
  node_app=bouquet-fl/superexec:e2e-$ARCH
  if [ "$BASE" = standin ]; then
    node_base=$(standin_image "$ARCH" "-$ARCH")
    # PyTorch's CPU index (the Dockerfile's default) serves aarch64 CPU wheels, but this machine reaches only
    # PyPI, whose aarch64 torch >= 2.10 is the CUDA build (plus about 3 GB of nvidia wheels); 2.9.1 is the
    # newest CPU-only aarch64 torch there. Set TORCH_PIP_ARGS / TORCH_SPEC to choose another.
    arch_pip_args=${USER_TORCH_PIP_ARGS/#unset/} arch_spec=${USER_TORCH_SPEC/#unset/torch==2.9.1}
    platform_flag=()
  else
    node_base=flwr/superexec:1.42.0
    arch_pip_args=${USER_TORCH_PIP_ARGS/#unset/--index-url https://download.pytorch.org/whl/cpu}
    arch_spec=${USER_TORCH_SPEC/#unset/torch>=2.4}
    platform_flag=(--platform "linux/$ARCH")
  fi
  if ! docker image inspect "$node_app" >/dev/null 2>&1 || [ "${REBUILD:-0}" = 1 ]; then
    log "building the bouquet app image for linux/$ARCH (emulated: several minutes)"
    rm -f docker/wheels/*.whl   # the host's torch wheel is of no use to an arm64 image
    docker build --network host "${platform_flag[@]}" ${PIP_CERT:+--build-arg PIP_CERT=$PIP_CERT} \
      --build-arg BASE_IMAGE="$node_base" --build-arg TORCH_PIP_ARGS="$arch_pip_args" --build-arg TORCH_SPEC="$arch_spec" \
      -t "$node_app" -f docker/Dockerfile . >"$WORK/app-$ARCH.log" 2>&1 || { tail -30 "$WORK/app-$ARCH.log"; exit 1; }
  fi
  if [ "$BASE" = standin ]; then node_supernode=$node_base; else node_supernode=flwr/supernode:1.42.0; fi
  fleet_args+=(--node-platform "linux/$ARCH" --node-app-image "$node_app")
  if [ "$NODE_LAYOUT" = pair ]; then fleet_args+=(--node-image "$node_supernode"); fi
fi
[ "$NODE_LAYOUT" = pair ] || fleet_args+=(--node-layout "$NODE_LAYOUT")
for assignment in ${NODE_ENV:-}; do fleet_args+=(--node-env "$assignment"); done
[ -n "$NODE_CPUS" ] && fleet_args+=(--node-cpus "$NODE_CPUS")
[ -n "$NODE_MEMORY" ] && fleet_args+=(--node-memory "$NODE_MEMORY")

# loopback ports for every service
free_port() { "$PY" -c "from bouquet.launch import free_port; print(free_port())"; }
export SUPERLINK_PORT=$(free_port) SUPERLINK_BIND=127.0.0.1 NODE_BIND=127.0.0.1
export SUPERLINK_ADDRESS=127.0.0.1:$SUPERLINK_PORT
for k in $(seq 0 $((NODES - 1))); do p=$(free_port); export NODE_${k}_PORT=$p NODE_${k}_ADDRESS=127.0.0.1:$p; done
export HOUSEHOLDS=$WORK/households BOUQUET_RESULTS=$WORK/results
rm -rf "$HOUSEHOLDS" "$BOUQUET_RESULTS"; mkdir -p "$BOUQUET_RESULTS"
daiad=${DAIAD:-../shared/data/daiad/swm_trialA.zip}
if [ -f "$daiad" ]; then extra=(--daiad "$daiad"); else extra=(); fi
"$PY" -m bouquet.deploy --households-only "$HOUSEHOLDS" --nodes "$NODES" "${extra[@]}" >/dev/null
log "one household file per node in $HOUSEHOLDS (${extra[*]:-synthetic})"

if [ "$NODES" = 3 ] && [ ${#fleet_args[@]} = 0 ]; then
  files=(-f docker-compose.yml)
  if [ "$TLS" = 1 ]; then files+=(-f docker/compose.tls.yml); fi
else
  "$PY" -m bouquet.fleet --nodes "$NODES" $([ "$TLS" = 1 ] && echo --tls) "${fleet_args[@]}" --out "$WORK/compose.yml" >/dev/null
  files=(-f "$WORK/compose.yml")
  log "compose file: $(head -1 "$WORK/compose.yml" | sed 's/^# //; s/;.*//')"
fi
COMPOSE="$COMPOSE_BIN -p bouquet-e2e --project-directory $ROOT ${files[*]}"
export FLWR_HOME=$WORK/flwr-home FLWR_TELEMETRY_ENABLED=0
rm -rf "$FLWR_HOME"; mkdir -p "$FLWR_HOME"
FLWR="$(dirname "$PY")/flwr"
if [ "$TLS" = 1 ]; then
  export CREDENTIALS=$WORK/credentials
  rm -rf "$CREDENTIALS"
  "$PY" -m bouquet.deploy --credentials-only "$CREDENTIALS" --nodes "$NODES" --address 127.0.0.1 >/dev/null
  connection="root-certificates = \"$CREDENTIALS/certificates/ca.crt\""
else
  connection="insecure = true"
fi
printf '[superlink]\ndefault = "bouquet-docker"\n\n[superlink.bouquet-docker]\naddress = "%s"\n%s\n' \
  "$SUPERLINK_ADDRESS" "$connection" >"$FLWR_HOME/config.toml"
log "building the bouquet app image ($BASE base, $HOST_ARCH)"
if [ "$BASE" = standin ] && [ -n "${wheel:-}" ]; then cp -u "$wheel" docker/wheels/; fi
$COMPOSE build >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
if [ "$TLS" = 1 ]; then
  log "TLS: starting the SuperLink, registering the $NODES node keys"
  $COMPOSE up -d superlink >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; exit 1; }
  for _ in $(seq 60); do "$FLWR" supernode list bouquet-docker >/dev/null 2>&1 && break; sleep 1; done
  for k in $(seq 0 $((NODES - 1))); do "$FLWR" supernode register "$CREDENTIALS/keys/node$k.pub" bouquet-docker >>"$WORK/up.log" 2>&1; done
fi
log "starting the stack: $NODES households on linux/$ARCH${NODE_CPUS:+, cpus $NODE_CPUS}${NODE_MEMORY:+, memory $NODE_MEMORY} each container"
$COMPOSE up -d >>"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; exit 1; }
up_started=$(date +%s)
# Everything shares this machine's cores here: give the SuperLink and the ServerApp CPU priority over the
# households (cgroup weight 8x the default; on a real deployment the SuperLink has its own machine). Without
# it, 20 households' ClientApps starting at once starved the SuperLink, whose SQLite state then answered
# "database is locked" (HTTP 500) to pushes of replies, and the replies were lost.
docker update --cpu-shares 8192 $($COMPOSE ps -q superlink serverapp) >/dev/null
wait_s=$(( 120 + 10 * NODES ))
if [ "$ARCH" != "$HOST_ARCH" ]; then wait_s=$(( wait_s + 300 )); fi
online_nodes() { "$FLWR" supernode list bouquet-docker --format json 2>/dev/null | grep -o '"online"' | wc -l || true; }
# wait_online SECONDS: until all NODES are online (sets $online), at most SECONDS
wait_online() {
  online=0
  for _ in $(seq "$1"); do online=$(online_nodes); [ "$online" -ge "$NODES" ] && return 0; sleep 1; done
  return 1
}
wait_online "$wait_s" || true
log "$online SuperNodes online after $(( $(date +%s) - up_started )) s"
[ "$online" -ge "$NODES" ] || { $COMPOSE logs --tail 40; exit 1; }

# memory of every container while the run goes on (docker stats' working set), read back at the end
docker stats --format '{{.Name}} {{.MemUsage}} {{.CPUPerc}}' >"$WORK/stats.log" 2>/dev/null &
STATS_PID=$!
# emulated nodes start a ClientApp (python + torch under qemu) in about a minute: give the identity query time
# and so do many households sharing this machine's cores (20 ClientApps start at once: 6 s each here)
node_wait=$(( NODES * 6 > 30 ? NODES * 6 : 30 )); if [ "$ARCH" != "$HOST_ARCH" ]; then node_wait=300; fi
# fl_run NAME ROUNDS TIMEOUT LOG [KEYS]: one `flwr run` of the water app as run NAME (results in
# $BOUQUET_RESULTS/NAME), with the run-config KEYS added, its output timestamped into LOG; returns when its
# summary.json is written, fails when the run ends without one
fl_run() {
  local name=$1 rounds=$2 timeout=$3 log_file=$4 keys=${5:-}
  local summary=$BOUQUET_RESULTS/$name/summary.json
  "$FLWR" run . bouquet-docker --stream --run-config \
    "data-source=\"daiad\" min-history-days=300 num-server-rounds=$rounds clients-per-round=$NODES local-epochs=1 node-wait-seconds=$node_wait round-timeout=$timeout results-dir=\"/results\" run-name=\"$name\" $keys" \
    2>&1 | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$log_file" \
    || log "run $name: flwr run's log stream ended with an error (the run may go on): $(grep -v '^[0-9.]* *$' "$log_file" | tail -2 | cut -d' ' -f2- | tr -s ' ' | tr '\n' ' ')"
  # `flwr run --stream` can end before the run does (its log stream fails when the SuperLink is overloaded or
  # restarted): wait for the summary while the SuperLink still lists a run as running, up to every round's
  # timeout (a run that never started is not listed, and fails below)
  local deadline=$(( $(date +%s) + rounds * timeout + 120 ))
  local listing
  while [ ! -f "$summary" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    listing=$("$FLWR" ls bouquet-docker --format json 2>/dev/null) || { sleep 5; continue; }  # SuperLink away
    echo "$listing" | "$PY" -c 'import json, sys
runs = json.load(sys.stdin).get("runs", [])
sys.exit(0 if any(not str(r.get("status", "")).lower().startswith("finished") for r in runs) else 1)' \
      || { sleep 5; break; }
    sleep 10
  done
  if [ ! -f "$summary" ]; then   # `flwr run --stream` exits 0 even when the ServerApp raised
    $COMPOSE logs --no-color >"$WORK/compose.log" 2>&1 || true
    log "no summary.json for run $name: it failed; its log: $log_file, every container's: $WORK/compose.log"
    tail -5 "$log_file"; return 1
  fi
}
log "flwr run: $ROUNDS rounds, $NODES households"
run_started=$(date +%s)
fl_run docker-e2e "$ROUNDS" "$ROUND_TIMEOUT" "$WORK/run.log"
run_s=$(( $(date +%s) - run_started ))
summary=$BOUQUET_RESULTS/docker-e2e/summary.json
kill "$STATS_PID" 2>/dev/null || true; STATS_PID=""
# per container: the cgroup's own peak (page cache included) and out-of-memory kills, read before teardown
for c in $($COMPOSE ps -q); do
  id=$(docker inspect -f '{{.Id}}' "$c"); name=$(docker inspect -f '{{.Name}}' "$c" | sed 's#^/##')
  peak=""; ooms=0
  for dir in /sys/fs/cgroup/memory/docker/$id /sys/fs/cgroup/system.slice/docker-$id.scope /sys/fs/cgroup/docker/$id; do
    if [ -f "$dir/memory.max_usage_in_bytes" ]; then peak=$(cat "$dir/memory.max_usage_in_bytes"); ooms=$(sed -n 's/^oom_kill //p' "$dir/memory.oom_control"); break; fi
    if [ -f "$dir/memory.peak" ]; then peak=$(cat "$dir/memory.peak"); ooms=$(sed -n 's/^oom_kill //p' "$dir/memory.events"); break; fi
  done
  echo "$name ${peak:-?} ${ooms:-0} $(docker inspect -f '{{.State.OOMKilled}} {{.RestartCount}}' "$c")"
done >"$WORK/cgroups.txt"
"$PY" - "$summary" "$WORK" "$NODES" "$ROUNDS" "$run_s" <<'PYCHECK'
import json, re, sys
from collections import defaultdict
summary_path, work, nodes, rounds, run_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
summary = json.load(open(summary_path))
assert summary["rounds"] == rounds and summary["clients-evaluated"] == nodes, summary
# a lost reply does not stop a run (the round goes on with the others); it is reported, not hidden
lost = {r["round"]: len(r["lost-nodes"]) for r in map(json.loads, open(summary_path.replace("summary.json",
        "rounds.jsonl"))) if r.get("phase") == "train" and r.get("lost-nodes")}
# round times from the timestamped log: "[ROUND k/N]" to the next, the last one to the end of the run
marks, end = [], None
for line in open(f"{work}/run.log"):
    stamp, _, text = line.partition(" ")
    end = float(stamp)
    if (m := re.search(r"\[ROUND (\d+)/\d+\]", text)):
        marks.append(float(stamp))
times = [b - a for a, b in zip(marks, marks[1:] + [end])]
unit = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
working, cpu = defaultdict(float), defaultdict(list)
for line in open(f"{work}/stats.log"):
    line = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line)
    if (m := re.search(r"(bouquet-e2e\S+) ([\d.]+)(B|KiB|MiB|GiB) / \S+ ([\d.]+)%", line)):
        key = re.sub(r"[-_]1$", "", m.group(1))
        working[key] = max(working[key], float(m.group(2)) * unit[m.group(3)])
        cpu[key].append(float(m.group(4)))
rows = []
for line in open(f"{work}/cgroups.txt"):
    name, peak, ooms, killed, restarts = line.split()
    short = re.sub(r"^bouquet-e2e[-_]|[-_]1$", "", name)
    peak_mib = int(peak) / 2**20 if peak.isdigit() else float("nan")
    key = re.sub(r"[-_]1$", "", name)
    load = cpu.get(key) or [float("nan")]
    rows.append((short, peak_mib, working.get(key, float("nan")), int(ooms or 0), killed, int(restarts),
                 sum(load) / len(load), max(load)))
rows.sort()
print(f"{'container':<14} {'cgroup peak MiB':>15} {'working set MiB':>15} {'oom kills':>9} {'restarts':>8} "
      f"{'CPU % mean':>10} {'CPU % max':>9}")
for short, peak_mib, work_mib, ooms, killed, restarts, mean_cpu, max_cpu in rows:
    print(f"{short:<14} {peak_mib:>15.0f} {work_mib:>15.0f} {ooms + (killed == 'true'):>9} {restarts:>8} "
          f"{mean_cpu:>10.1f} {max_cpu:>9.1f}")
kills = sum(r[3] + (r[4] == "true") for r in rows)
households = [r for r in rows if r[0].startswith(("supernode", "clientapp", "node-"))]
per_house = sum(r[2] for r in households) / max(nodes, 1)
print(f"docker e2e OK: {rounds} rounds, {nodes} households, MAE {summary['mae-litres-mean']:.1f} L/day; "
      f"run {run_s} s, rounds {', '.join(f'{t:.1f}' for t in times)} s; "
      f"working set per household (its containers) {per_house:.0f} MiB; out-of-memory kills {kills}; "
      f"lost training replies: {', '.join(f'round {k}: {v}' for k, v in lost.items()) or 'none'}")
PYCHECK
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'bouquet' >"$WORK/images.txt" || true
log "passed; images: $(tr '\n' ';' <"$WORK/images.txt")"

if [ "$ATTACK" = 1 ]; then
  # Attacks on real processes: attack-fraction 1/NODES makes one household an attacker (drawn from the run's
  # seed on every node: each SuperNode's node config carries num-partitions); its ClientApp sends theta - u
  # instead of theta + u. Same seed and data in all three runs.
  robust='strategy="hk-cosine" coalition-robust=true'
  flips="attack=\"sign-flip\" attack-fraction=$("$PY" -c "print(1 / $NODES)")"
  log "attack: robust HK without attackers, then the paper's HK and robust HK with one household sending sign flips"
  fl_run docker-e2e-robust-clean "$ROUNDS" "$ROUND_TIMEOUT" "$WORK/run-robust-clean.log" "$robust"
  fl_run docker-e2e-paper-flips "$ROUNDS" "$ROUND_TIMEOUT" "$WORK/run-paper-flips.log" "strategy=\"hk-cosine\" $flips"
  fl_run docker-e2e-robust-flips "$ROUNDS" "$ROUND_TIMEOUT" "$WORK/run-robust-flips.log" "$robust $flips"
  "$PY" - "$BOUQUET_RESULTS" "$NODES" <<'PYATTACK'
import csv, json, sys
base, nodes = sys.argv[1], int(sys.argv[2])
def run(name):
    rows = [json.loads(line) for line in open(f"{base}/{name}/rounds.jsonl")]
    clients = list(csv.DictReader(open(f"{base}/{name}/clients.csv")))
    return json.load(open(f"{base}/{name}/summary.json")), [r for r in rows if r.get("phase") == "train"], clients
(clean, _, clean_clients), (paper, paper_rounds, paper_clients), (robust, robust_rounds, robust_clients) = (
    run("docker-e2e-robust-clean"), run("docker-e2e-paper-flips"), run("docker-e2e-robust-flips"))
assert len(robust["attackers"]) == 1 and robust["attackers"] == paper["attackers"], (robust, paper)
attacker = robust["attackers"][0]
def honest_mae(clients):  # the same households in every run: all but the attacker's partition
    values = [float(c["mae-litres"]) for c in clients if int(c["partition-id"]) != attacker]
    return sum(values) / len(values)
print(f"household {attacker} of {nodes} sends sign flips; the other households' MAE (L/day): robust HK, no attack "
      f"{honest_mae(clean_clients):.2f}; paper HK, sign flips {honest_mae(paper_clients):.2f}; robust HK, sign flips "
      f"{honest_mae(robust_clients):.2f}")
print("round  attacker's share of the model: paper HK  robust HK  left out by robust HK")
for p, r in zip(paper_rounds, robust_rounds):
    print(f"{r['round']:>5}  {p['attacker-share']:>38.6f}  {r['attacker-share']:>9.6f}  {r['screened-nodes']}")
# the direction screen never leaves an honest household out, and leaves the flipping one out at least once (it
# needs the honest updates to share a direction; the same runs in simulation leave it out in the same rounds:
# docs/RELIABILITY.md, "Attacks in the Docker deployment")
honest_out = [(r["round"], n) for r in robust_rounds for n in r["screened-nodes"] if n not in r["attacker-nodes"]]
assert not honest_out, f"robust HK left honest households out: {honest_out}"
caught = [r["round"] for r in robust_rounds if r["screened-nodes"]]
assert caught, "robust HK never left the flipping household out"
print(f"attack OK: the flipping household left out in rounds {caught} of {len(robust_rounds)}")
PYATTACK
fi

[ "$RECONNECT" = 1 ] || exit 0

# Reconnects, on the same stack: (1) household 0's box frozen (`docker pause`, its SuperNode and
# ClientApp) for longer than the round timeout, then thawed; (2) the SuperLink container killed and started
# again (same container, so the same state.db with the registered node keys) in the middle of a run. Nothing
# is restarted by hand but the SuperLink: the nodes must come back by themselves, and a run after each must
# have every household.
if [ "$NODE_LAYOUT" = single ]; then box_services=(node-0); else box_services=(supernode-0 clientapp-0); fi
box=$($COMPOSE ps -q "${box_services[@]}")
# wait_round LOG PID: until the run writing LOG has started round 1 (or has ended)
wait_round() {
  until grep -q '\[ROUND 1/' "$1" 2>/dev/null; do kill -0 "$2" 2>/dev/null || return 1; sleep 1; done
}
lost_in() {  # lost training replies per round of run $1, as "round:count ..."
  "$PY" -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(" ".join("%s:%d" % (r["round"], len(r.get("lost-nodes") or [])) for r in rows if r.get("phase") == "train"))' \
    "$BOUQUET_RESULTS/$1/rounds.jsonl"
}
evaluated_in() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["clients-evaluated"])' "$BOUQUET_RESULTS/$1/summary.json"; }

frozen_s=$(( CUT_TIMEOUT + 60 ))
log "reconnect 1: a 1-round run with round-timeout $CUT_TIMEOUT s; household 0's box is paused for $frozen_s s once round 1 starts"
fl_run docker-e2e-cut 1 "$CUT_TIMEOUT" "$WORK/run-cut.log" &
cut_pid=$!
wait_round "$WORK/run-cut.log" "$cut_pid" || { wait "$cut_pid"; exit 1; }
docker pause $box >/dev/null
paused_at=$(date +%s)
sleep "$frozen_s"
docker unpause $box >/dev/null
thawed_at=$(date +%s)
log "household 0 thawed after $(( thawed_at - paused_at )) s"
wait "$cut_pid"
cut_lost=$(lost_in docker-e2e-cut); cut_evaluated=$(evaluated_in docker-e2e-cut)
log "the run with the frozen box completed: lost training replies (round:count) $cut_lost, clients evaluated $cut_evaluated"
[ "$cut_lost" = "1:1" ] || { log "expected household 0's reply of round 1 to be lost, got '$cut_lost'"; exit 1; }
wait_online 300 || { log "household 0 did not come back: $online of $NODES online 300 s after the thaw"; exit 1; }
rejoin_s=$(( $(date +%s) - thawed_at ))
log "all $NODES SuperNodes online again $rejoin_s s after the thaw"

log "reconnect 2: a 2-round run; the SuperLink container is killed (docker restart -t 0) once round 1 starts"
mid_pid=""
fl_run docker-e2e-restart 2 "$CUT_TIMEOUT" "$WORK/run-restart.log" &
mid_pid=$!
wait_round "$WORK/run-restart.log" "$mid_pid" || { wait "$mid_pid"; exit 1; }
link=$($COMPOSE ps -q superlink)
link_started=$(docker inspect -f '{{.State.StartedAt}}' "$link")
docker restart -t 0 "$link" >/dev/null
restarted_at=$(date +%s)
[ "$(docker inspect -f '{{.State.StartedAt}}' "$link")" != "$link_started" ] || { log "the SuperLink container was not restarted"; exit 1; }
wait_online 300 || { log "the nodes did not come back: $online of $NODES online 300 s after the SuperLink restart"; exit 1; }
back_s=$(( $(date +%s) - restarted_at ))
log "SuperLink restarted (its container started again at $(docker inspect -f '{{.State.StartedAt}}' "$link")); all $NODES SuperNodes online again $back_s s later, no key registered again"
if wait "$mid_pid"; then mid_outcome="completed (lost replies $(lost_in docker-e2e-restart))"; else mid_outcome="did not complete"; fi
log "the run cut by the SuperLink restart: $mid_outcome"
"$FLWR" ls bouquet-docker --format json >"$WORK/runs-after-restart.json" 2>&1 || true   # every run's status
after_started=$(date +%s)
fl_run docker-e2e-after 1 "$CUT_TIMEOUT" "$WORK/run-after.log"
after_lost=$(lost_in docker-e2e-after); after_evaluated=$(evaluated_in docker-e2e-after)
[ "$after_lost" = "1:0" ] && [ "$after_evaluated" = "$NODES" ] \
  || { log "the run after the restart lost replies ($after_lost) or evaluated $after_evaluated of $NODES"; exit 1; }
restarts=$(for c in $($COMPOSE ps -q); do docker inspect -f '{{.Name}}={{.RestartCount}}' "$c"; done | sed 's#^/bouquet-e2e[-_]##; s#[-_]1=#=#' | tr '\n' ' ')
log "reconnect OK: frozen box lost its round-1 reply and was online again $rejoin_s s after the thaw; SuperLink restart mid-run: run $mid_outcome, nodes back in $back_s s, next run $(( $(date +%s) - after_started )) s with all $NODES households; container restarts: $restarts"
