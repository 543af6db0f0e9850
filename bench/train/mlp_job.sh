# Sourced by the training benchmarks (bench/train/run.sh, bench/pods/run.sh, bench/sync/run.sh):
# the job they time.
#
#   write_mlp_job FILE NAME REPLICAS RANKS_PER_WORKER STEPS [HIDDEN [TRAINER_LINES]]
#
# A 784-HIDDEN-10 ReLU MLP (HIDDEN 256 unless given) on Fashion-MNIST, batch 64 per rank, SGD
# with momentum 0.9, seed 1. TRAINER_LINES: more fields of spec.trainer, indented by 4 spaces
# (e.g. "    sync: {strategy: dgc}").
write_mlp_job() {
  cat >"$1" <<YAML
apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: $2}
spec:
  replicas: $3
  ranksPerWorker: $4
  trainer:
    model: {type: mlp, hidden: [${6:-256}], activation: relu}
    data:
      format: idx
      train: [file:///usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz,
              file:///usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz]
      # The test split makes the workers evaluate, and the rendezvous service keeps the final
      # report only from a Leave that carries an accuracy.
      test: [file:///usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz,
             file:///usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz]
    batchSize: 64
    steps: $5
    optimizer: {type: sgd, learningRate: 0.05, momentum: 0.9}
    seed: 1
    logIntervalSteps: 100000
${7:-}
  metrics: {port: 0}
YAML
}
