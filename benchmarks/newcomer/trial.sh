#!/usr/bin/env bash
# The newcomer's trial: a RotNet folder written from the README and methods/_template alone, added to a
# fresh clone that holds a finished default run copied from elsewhere (results/ with its dates, no
# .snakemake/). Prints, for each step, what a user sees; benchmarks/newcomer/README.md records a run.
#   bash benchmarks/newcomer/trial.sh <a finished default run's results/> [<clone folder>]
# in the project's virtual environment (the clone's own sslbench is imported: PYTHONPATH).
set -u
RESULTS=$(realpath "$1")
CLONE=${2:-/tmp/sslbench-trial}
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf "$CLONE" && git clone -q "$REPO" "$CLONE" && cd "$CLONE" || exit 1
cp -a "$RESULTS/." results/  # into the clone's own results/ (it holds a README)
export PYTHONPATH=$CLONE
echo "== commit $(git rev-parse --short HEAD); the copied results: $(find results -name '*.json' -path '*/eval/*' | wc -l) results"

plan() { snakemake -n -q rules "$@" 2>&1; echo "exit $?"; }
# the job counts (printed twice by snakemake: once), or its "Nothing to be done"
jobs() { plan "$@" | grep -E '^[a-z_]+ +[0-9]+$|^Nothing|^exit' | awk '!seen[$0]++'; }

echo "== 1. the copied results, nothing added"; jobs
# results from a commit before results/collected.txt existed re-collect once; then no .snakemake/ again
snakemake --cores all > /tmp/trial_collect.log 2>&1; echo "collect and report: exit $?"
rm -rf .snakemake
echo "== 1b. the same, after that"; jobs
cp -r "$REPO/benchmarks/newcomer/rotnet" methods/rotnet
echo "== 2. the RotNet folder added"; jobs

# each mistake on a copy of the folder, undone after
mistake() {
  local what=$1; shift
  cp -r methods/rotnet /tmp/rotnet.keep
  "$@"
  echo "== mistake: $what"
  plan | grep -v '^$' | grep -iE 'error|rotnet|exit|fix|set ' | head -6
  rm -rf methods/rotnet && mv /tmp/rotnet.keep methods/rotnet
}
mistake "augment key typo (crop_scal)" sed -i 's/  crop_scale: \[0.5, 1.0\]/  crop_scal: [0.5, 1.0]/' methods/rotnet/config.yaml
mistake "augment value out of range (crop_scale [0.0, 1.0])" sed -i 's/crop_scale: \[0.5, 1.0\]/crop_scale: [0.0, 1.0]/' methods/rotnet/config.yaml
cat > /tmp/override.yaml <<'YAML'
method_overrides: {rotnet: {augment: {crop_scal: [0.5, 1.0]}}}
YAML
echo "== mistake: augment key typo in a preset's method_overrides"
plan --configfile /tmp/override.yaml | grep -iE 'error|override|exit' | head -4
mistake "method.py syntax error" sed -i 's/^class RotNet(Method):/class RotNet(Method)/' methods/rotnet/method.py
mistake "no Method subclass" sed -i 's/^class RotNet(Method):/class RotNet:/' methods/rotnet/method.py
mistake "training_loss misspelt" sed -i 's/def training_loss/def traning_loss/' methods/rotnet/method.py
mistake "a parameter read that config.yaml does not set" sed -i 's/\["num_rotations"\]/["num_rotation"]/' methods/rotnet/method.py
mistake "config.yaml missing" rm methods/rotnet/config.yaml
mistake "paper.yaml: misspelt protocol, a percent" bash -c 'printf "results:\n  - {pretrain_dataset: cifar10, eval_dataset: cifar10, backbone: nin, epochs: 100, protocol: linaer, metric: top1, value: 89.06, source: Table 1}\n" > methods/rotnet/paper.yaml'
mistake "paper.yaml: the template's placeholders" cp methods/_template/paper.yaml methods/rotnet/paper.yaml
mistake "README.md without its sections" bash -c 'echo "# RotNet" > methods/rotnet/README.md'

echo "== 3. the run"
/usr/bin/time -f "wall %e s" snakemake --cores all > /tmp/trial_run.log 2>&1; echo "exit $?"; tail -1 /tmp/trial_run.log
grep -c 'rule pretrain' /tmp/trial_run.log | sed 's/^/pretrain jobs run: /'
python - <<'PY'
import pandas as pd
t = pd.read_csv("results/table.csv")
r = t[t["method"] == "rotnet"]
print(f"rotnet rows: {len(r)} of {len(t)}; git_dirty: {sorted(r['git_dirty'].unique())}")
print(r[(r.protocol == "knn") & (r.eval_dataset == "digits")][["seed", "metric", "value"]].head(3).to_string(index=False))
PY
echo "== 4. status after the run"; sslbench status | head -3
