#!/usr/bin/env bash
# weft deploy kubernetes, end to end without a cluster: the manifests of a few configs (an S3 store
# with serving engines in the workers' pods, the store server with autoscaled workers, vLLM
# replicas on a model volume, and a mixed deployment whose orchestrator and store run elsewhere)
# are checked against the Kubernetes API's schemas and for what the schemas cannot see
# (validate_manifests.mjs); secrets.sh runs against a stand-in kubectl that records what it was
# asked to create; and configs that cannot deploy are refused, naming the key.
# Usage: kubernetes_test.sh WEFT WORKDIR NPM_DIR
#   NPM_DIR keeps the validator's npm packages between runs (tests/deploy/node_modules.sh).
set -uo pipefail
weft=$1 work=$2 npm_dir=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$here/node_modules.sh" install || exit 1
bash "$here/node_modules.sh" "$npm_dir" || exit 1
# Node resolves the packages from the script's own directory.
cp "$here/validate_manifests.mjs" "$npm_dir/" || exit 1
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$here/../test_lib.sh"

# A kubectl that records each call (its arguments, one a line, in a file of its own in the directory
# KUBECTL_RECORD: secrets.sh runs two at once, in a pipe) and creates nothing. Where a
# real kubectl is installed, it makes the Secrets' manifests (create --dry-run=client needs no
# cluster), so that secrets.sh's command lines are checked too; apply keeps what it is given.
REAL_KUBECTL=$(command -v kubectl || true)
export REAL_KUBECTL
mkdir -p bin
cat > bin/kubectl << 'EOF'
#!/bin/sh
for a in "$@"; do printf '%s\n' "$a"; done > "$KUBECTL_RECORD/call-$$"
case "$1" in
  get) exit 1 ;;  # no Secret exists yet
  create)
    if [ -n "$REAL_KUBECTL" ]; then KUBECONFIG=/nonexistent exec "$REAL_KUBECTL" "$@"; fi
    printf 'kind: Secret\nmetadata:\n  name: %s\n' "$4" ;;
  apply) cat > "$KUBECTL_RECORD/applied-$$" ;;
esac
EOF
chmod +x bin/kubectl

# The values secrets.sh reads; none of them may reach a file of the output.
export WEFT_WORKER_TOKEN=env-worker-Zq81 WEFT_TRAINER_TOKEN=env-trainer-Kp20 WEFT_ADMIN_TOKEN=env-admin-Xv33
export ENGINE_API_KEY=env-engine-key-Lm44
export AWS_ACCESS_KEY_ID=AKIAENVTEST AWS_SECRET_ACCESS_KEY=env-aws-secret-Qw55
export AWS_SESSION_TOKEN=env-aws-session-Rt66 AWS_REGION=eu-west-1 AWS_ENDPOINT_URL_S3=http://s3.internal:7480

# The parts every config shares: tokens in the file (which must not reach the output).
common() {
  cat << EOF
run: {id: $1}
orchestrator:
  listen: 127.0.0.1:8171
  max_staleness: 3
  tokens: {worker: cfg-worker-Ab12, trainer: cfg-trainer-Cd34, admin: cfg-admin-Ef56}
EOF
}

# An S3 store; SGLang in the workers' pods (two replicas of two GPUs each), its served checkpoint
# per cluster in /dev/shm; a trainer of one's own whose arguments hold what the kubelet would
# expand; the engines' API key from the environment.
{ common s3-run; cat << 'EOF'
store: {uri: "s3://weft-bucket/runs?region=eu-west-1"}
regions:
  - {name: us-east, relay: 127.0.0.1:8181, workers: 2}
  - {name: ap-south-1, relay: 127.0.0.1:8182, workers: 1}
worker: {engine: sglang, capacity: 16}
engine:
  checkpoint_dir: /dev/shm/weft/{cluster}
  api_key_env: ENGINE_API_KEY
model: {context: 12}
trainer:
  command: [python3, trainer.py, "--tag=$(whoami)"]
  env: {PYTHONUNBUFFERED: "1", GREETING: "yes"}
deploy:
  engine:
    command: [python3, -m, sglang.launch_server, --model-path, /models/base, --tp, "{gpus}",
              --port, "{port}", --host, 127.0.0.1, --served-model-name, "policy-{replica}-{cluster}"]
    gpus: 2
    port: 30000
    env: {SGLANG_RETURN_ORIGINAL_LOGPROB: "1"}
    image: lmsysorg/sglang:v0.5.6
  kubernetes:
    namespace: rl-s3
    image: registry.example/weft:1.0
    image_pull_policy: Always
    orchestrator: {cpu: "2", memory: 4Gi, journal_size: 20Gi}
    trainer: {cpu: "8", memory: 32Gi}
    relays: {cpu: "1", memory: 2Gi, cache_size: 100Gi}
    workers:
      cpu: "2"
      memory: 48Gi
      gpus: 4
      drain: 5m
      engine: {cpu: "8", memory: 64Gi}
      models: {path: /models}
    regions:
      us-east: {node_selector: {gpu: h100}}
      ap-south-1: {node_selector: {"on": "yes", topology.kubernetes.io/region: ap-south-1}}
EOF
} > s3.yaml

# The store server on Kubernetes, the built-in trainer, embedded engines, autoscaled workers.
{ common store-run; cat << 'EOF'
store: {listen: 127.0.0.1:8170}
regions:
  - {name: us-east, relay: 127.0.0.1:8181, workers: 3}
  - {name: eu-west, relay: 127.0.0.1:8182, workers: 2}
trainer: {steps: 10, env: {OMP_NUM_THREADS: "4", HOME_TOO: "$(HOME)"}}
deploy:
  kubernetes:
    namespace: weft-demo
    image: registry.example/weft:1.0
    storage_class: fast-ssd
    orchestrator: {cpu: "1", memory: 1Gi}
    store: {cpu: "1", memory: 2Gi, size: 200Gi}
    trainer: {cpu: "4", memory: 8Gi}
    relays: {cache_size: 30Gi}
    workers: {cpu: "2", memory: 4Gi, autoscale: {min: 1, max: 8, jobs_per_worker: 4}}
    regions:
      us-east: {node_selector: {topology.kubernetes.io/region: us-east-1}}
      eu-west:
EOF
} > store.yaml

# vLLM, two replicas of one GPU each, the served checkpoint at a fixed path, the models from a
# PersistentVolumeClaim; the store server.
{ common engine-run; cat << 'EOF'
store: {listen: 127.0.0.1:8170}
regions:
  - {name: gpu-1, relay: 127.0.0.1:8181, workers: 4}
worker: {engine: vllm, capacity: 8}
engine: {checkpoint_dir: /var/lib/weft-served, pause: abort}
model: {context: 12}
deploy:
  engine:
    command: [vllm, serve, /models/base, --port, "{port}", --host, 127.0.0.1, --logprobs-mode, raw_logprobs]
    gpus: 1
    port: 8000
    env: {VLLM_SERVER_DEV_MODE: "1"}
    image: vllm/vllm-openai:v0.15.0
  kubernetes:
    image: registry.example/weft:1.0
    orchestrator: {}
    store: {}
    trainer: {}
    workers: {gpus: 2, drain: 90s, models: {path: /models, claim: base-model}}
    regions:
      gpu-1: {node_selector: {accelerator: a100}}
EOF
} > engine.yaml

# The orchestrator, the store server and the trainer on Slurm; one region on Kubernetes, which
# reaches them at the URLs its section gives.
{ common mixed-run; cat << 'EOF'
store: {listen: 127.0.0.1:8170}
regions:
  - {name: us-east, relay: 127.0.0.1:8181, workers: 2}
  - {name: eu-west, relay: 127.0.0.1:8182, workers: 3}
deploy:
  slurm:
    dir: /shared/weft
    partitions:
      cpu: {}
      batch: {region: us-east}
    orchestrator: {partition: cpu}
    store: {partition: cpu}
    trainer: {partition: cpu}
  kubernetes:
    namespace: rl
    image: registry.example/weft:1.0
    orchestrator_url: http://login-node.example.org:8171
    store_url: http://login-node.example.org:8170
    relays: {cache_size: 10Gi}
    workers: {cpu: "1", memory: 1Gi, drain: 45s}
    regions:
      eu-west: {node_selector: {pool: rollout}}
EOF
} > mixed.yaml

# deploy CONFIG FILES...: writes the manifests, runs secrets.sh with the stand-in kubectl, and
# checks the files written and everything validate_manifests.mjs checks.
deploy() {
  local config=$1; shift
  local name=${config%.yaml}
  expect_ok "$weft" deploy kubernetes "$config" --out "out-$name"
  local expected written
  expected=$(printf '%s\n' "$@" secrets.sh | sort)
  written=$(ls "out-$name" | sort)
  [ "$expected" = "$written" ] && ok || fail "$config: wrote $(echo $written), expected $(echo $expected)"
  rm -rf "calls-$name" && mkdir "calls-$name"
  if KUBECTL_RECORD=$PWD/calls-$name PATH=$PWD/bin:$PATH sh "out-$name/secrets.sh" > secrets.txt 2>&1; then
    ok
  else
    fail "$config: secrets.sh failed: $(cat secrets.txt)"
  fi
  if node "$npm_dir/validate_manifests.mjs" "out-$name" "$config" "calls-$name" > validate.txt 2>&1; then
    ok
  else
    fail "$config: the manifests do not check out:"$'\n'"$(cat validate.txt)"
  fi
  # The values secrets.sh took from the environment reached kubectl, and no file.
  local variable
  for variable in WEFT_WORKER_TOKEN WEFT_TRAINER_TOKEN WEFT_ADMIN_TOKEN ENGINE_API_KEY AWS_SECRET_ACCESS_KEY \
      AWS_SESSION_TOKEN; do
    if grep -rqF -- "${!variable}" "out-$name"; then fail "$config: the value of $variable is in out-$name"; else ok; fi
  done
  grep -qx -- "--from-literal=worker=$WEFT_WORKER_TOKEN" "calls-$name"/call-* && ok ||
    fail "$config: secrets.sh did not give kubectl the worker token"
  grep -q "name: weft-tokens" "calls-$name"/applied-* 2> /dev/null && ok ||
    fail "$config: secrets.sh applied no Secret weft-tokens: $(cat "calls-$name"/applied-* 2> /dev/null)"
}

deploy s3.yaml config.yaml orchestrator.yaml relay-us-east.yaml workers-us-east.yaml \
  relay-ap-south-1.yaml workers-ap-south-1.yaml trainer.yaml
deploy store.yaml config.yaml orchestrator.yaml store.yaml relay-us-east.yaml workers-us-east.yaml \
  relay-eu-west.yaml workers-eu-west.yaml trainer.yaml
deploy engine.yaml config.yaml orchestrator.yaml store.yaml relay-gpu-1.yaml workers-gpu-1.yaml trainer.yaml
deploy mixed.yaml config.yaml relay-eu-west.yaml workers-eu-west.yaml

# What each config's manifests hold beyond what the validator checks of any deployment.
s3=out-s3 store=out-store engine=out-engine mixed=out-mixed
grep -qx -- "--from-literal=AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY" calls-s3/call-* && ok ||
  fail "secrets.sh did not create the S3 Secret's secret key"
grep -q 'name: AWS_SECRET_ACCESS_KEY' $s3/relay-us-east.yaml && grep -q 'name: AWS_SECRET_ACCESS_KEY' $s3/trainer.yaml &&
  ok || fail "the relays and the trainer lack the S3 credentials"
grep -q 'AWS_' $s3/workers-us-east.yaml && fail "workers got S3 credentials (they read through their relay)" || ok
grep -q -- '- --tag=\$\$(whoami)' $s3/trainer.yaml && ok || fail "trainer.command's \$(...) is not escaped"
grep -q 'policy-1-\$(POD_NAME)' $s3/workers-us-east.yaml && ok || fail "{replica} and {cluster} are not filled in"
grep -q 'mountPath: /dev/shm$' $s3/workers-us-east.yaml && ok || fail "the /dev/shm checkpoint volume is not /dev/shm"
grep -q 'terminationGracePeriodSeconds: 330' $s3/workers-us-east.yaml && ok || fail "the grace period is not drain + 30 s"
grep -q 'averageValue: "8"' $store/workers-eu-west.yaml && ok ||
  fail "the autoscaler's target is not jobs_per_worker times the Kubernetes regions"
grep -q 'kind: HorizontalPodAutoscaler' $s3/workers-us-east.yaml && fail "an autoscaler nobody configured" || ok
grep -q 'storageClassName: fast-ssd' $store/store.yaml && ok || fail "storage_class is not used"
grep -q 'storage: "200Gi"' $store/store.yaml && ok || fail "the store's volume is not store.size"
grep -q 'value: \$\$(HOME)' $store/trainer.yaml && ok || fail "trainer.env's \$(...) is not escaped"
grep -qx -- "--from-literal=store=.*" calls-store/call-* && ok || fail "no store writer token for the store server"
grep -q 'mountPath: /var/lib/weft-served$' $engine/workers-gpu-1.yaml && ok ||
  fail "the served checkpoint volume is not at engine.checkpoint_dir"
grep -q 'claimName: base-model' $engine/workers-gpu-1.yaml && ok || fail "the models' claim is not mounted"
grep -q 'name: dshm' $engine/workers-gpu-1.yaml && ok || fail "the engines have no /dev/shm of their own"
grep -q 'http://login-node.example.org:8171' $mixed/workers-eu-west.yaml && ok || fail "orchestrator_url is not used"
grep -q 'http://login-node.example.org:8170' $mixed/relay-eu-west.yaml && ok || fail "store_url is not used"
grep -q 'kind: Service' $mixed/workers-eu-west.yaml && fail "a Service for workers" || ok
[ -x $mixed/secrets.sh ] && ok || fail "secrets.sh is not executable"

# secrets.sh refuses missing or shared tokens before calling kubectl.
rm -rf calls-refused && mkdir calls-refused
if env -u WEFT_ADMIN_TOKEN KUBECTL_RECORD=$PWD/calls-refused PATH=$PWD/bin:$PATH sh $mixed/secrets.sh > err.txt 2>&1; then
  fail "secrets.sh ran without WEFT_ADMIN_TOKEN"
else
  grep -q WEFT_ADMIN_TOKEN err.txt && ok || fail "secrets.sh's refusal does not name WEFT_ADMIN_TOKEN: $(cat err.txt)"
fi
if WEFT_ADMIN_TOKEN=$WEFT_WORKER_TOKEN KUBECTL_RECORD=$PWD/calls-refused PATH=$PWD/bin:$PATH sh $mixed/secrets.sh > err.txt 2>&1; then
  fail "secrets.sh took the same token for two roles"
else
  grep -q "must all be different" err.txt && ok || fail "secrets.sh's refusal: $(cat err.txt)"
fi
[ -z "$(ls calls-refused)" ] && ok || fail "secrets.sh called kubectl although it refused"

# Configs that cannot deploy: refused, naming the key.
refused() {
  local pattern=$1 config=$2
  expect_error "$pattern" "$weft" deploy kubernetes "$config" --out out-refused
  [ ! -e out-refused ] && ok || fail "$config: files written although refused"
}
sed 's/workers: {cpu: "1", memory: 1Gi, drain: 45s}/workers: {cpu: "1", partition: gpu}/' mixed.yaml > bad-partition.yaml
refused "deploy.kubernetes.workers.partition (line [0-9]*): a Slurm setting" bad-partition.yaml
sed '/eu-west: {node_selector/d; s/^    regions:$/    regions: {}/' mixed.yaml > bad-nowhere.yaml
refused "region 'eu-west' has nowhere to run" bad-nowhere.yaml
grep -q "deploy.kubernetes.regions does not list it" err.txt && ok || fail "the refusal does not name deploy.kubernetes.regions"
sed '/image: registry/d' mixed.yaml > bad-image.yaml
refused "deploy.kubernetes.image: required" bad-image.yaml
sed '/image: lmsysorg/d' s3.yaml > bad-engine-image.yaml
refused "deploy.engine.image: required on Kubernetes" bad-engine-image.yaml
sed 's|checkpoint_dir: /dev/shm/weft/{cluster}|checkpoint_dir: served/{cluster}|' s3.yaml > bad-checkpoint.yaml
refused "engine.checkpoint_dir: 'served/{cluster}' is not an absolute path" bad-checkpoint.yaml
sed 's/autoscale: {min: 1, max: 8, jobs_per_worker: 4}/autoscale: {min: 5, max: 2, jobs_per_worker: 4}/' store.yaml > bad-autoscale.yaml
refused "deploy.kubernetes.workers.autoscale.max (2) is below min (5)" bad-autoscale.yaml
sed 's/autoscale: {min: 1, max: 8, jobs_per_worker: 4}/autoscale: {max: 8}/' store.yaml > bad-autoscale2.yaml
refused "deploy.kubernetes.workers.autoscale.jobs_per_worker: required" bad-autoscale2.yaml
sed 's/- {name: eu-west,/- {name: eu-west-a-region-name-far-too-long-for-object-names,/; s/^      eu-west:$/      eu-west-a-region-name-far-too-long-for-object-names:/' \
  store.yaml > bad-region.yaml
refused "regions\[1\].name: 'eu-west-a-region-name-far-too-long-for-object-names' cannot name Kubernetes objects" bad-region.yaml
sed 's/^run: {id: store-run}/run: {id: store-run}\ntask: {kind: http, url: "http:\/\/rewards:8300\/score", token: cfg-reward-Gh78, max_prompt_tokens: 7, max_tokens: 4}/' \
  store.yaml > bad-task-token.yaml
refused "task.token: the reward service's token would be written into the run config's ConfigMap" bad-task-token.yaml
sed 's/trainer: {steps: 10, env: {OMP_NUM_THREADS: "4", HOME_TOO: "$(HOME)"}}/trainer: {env: {WEFT_STORE_TOKEN: x}}/' \
  store.yaml > bad-trainer-env.yaml
refused "trainer.env.WEFT_STORE_TOKEN: the deployment sets it" bad-trainer-env.yaml
sed 's/models: {path: \/models}/models: {path: models}/' s3.yaml > bad-models.yaml
refused "deploy.kubernetes.workers.models.path: 'models' is not an absolute path" bad-models.yaml
mkdir -p here && cp store.yaml here/config.yaml
expect_error "would replace the run config itself" "$weft" deploy kubernetes here/config.yaml --out here
cmp -s store.yaml here/config.yaml && ok || fail "the run config was overwritten"

echo "deploy_kubernetes: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
