#!/usr/bin/env bash
# GPU checks for issues 12, 34 and 37: the CUDA tests of the sync-free / captured training step, of the
# fused kernel and norm, of the conjugate refit and of
# the folded prediction; the two-target model's posterior, conditioning, hexagons, plans and the
# demo workflow with the model fitted on CUDA (where geopandas, h3, pyogrio, rasterio and dask are
# installed);
# then the step-time and prediction benchmark on CUDA. GPU_CHECK_BENCHMARK=0 leaves the benchmark out.
# Run from the repository root on a machine with a CUDA GPU:  bash benchmarks/gpu_check.sh
# PYTHON picks the interpreter (default python3); extra arguments go to the benchmark.
# --noconftest and --data synthetic: tests/conftest.py and the PR sample need geopandas,
# which these checks do not (set BENCH_DATA=pr where it is installed).
set -euo pipefail
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout, installed or not
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
"$PYTHON" -c "import torch, gpytorch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpytorch', gpytorch.__version__)"
"$PYTHON" -m pytest -q -p no:cacheprovider --noconftest tests/test_training_step.py tests/test_folded_prediction.py \
    tests/test_fast_step.py tests/test_conjugate_posterior.py::test_the_fit_on_cuda_equals_the_fit_on_the_cpu
if "$PYTHON" -c "import geopandas, h3, pyogrio, rasterio, dask" 2>/dev/null; then
    GEODBK_TEST_DEVICE=cuda "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_two_targets.py \
        tests/test_hexagons.py tests/test_workflow.py
else
    echo "geopandas, h3, pyogrio, rasterio or dask missing: the CUDA fit's decision tests are left out"
fi
[ "${GPU_CHECK_BENCHMARK:-1}" = 0 ] && exit 0
"$PYTHON" benchmarks/bench_dppgp_vs_gpytorch.py --device cuda --data "${BENCH_DATA:-synthetic}" "$@"
