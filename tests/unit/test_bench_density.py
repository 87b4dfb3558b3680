"""bench_density's pure parts: smaps by package, the answers' wrappers, V2 requests for MLServer,
and the report's ratios against the floor."""

from loadtests.density import report, smaps
from loadtests.density.loaders import bare
from loadtests.density.mlserver import v2_answer, v2_request

SMAPS = """\
7f0000000000-7f0000100000 r-xp 00000000 fd:01 11 /v/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
Size:               1024 kB
Pss:                 300 kB
Shared_Clean:        800 kB
Private_Clean:       100 kB
VmFlags: rd ex mr mw me
7f0000100000-7f0000200000 r--p 00000000 fd:01 12 /v/lib/python3.11/site-packages/numpy.libs/libopenblas.so
Pss:                  50 kB
Private_Dirty:        50 kB
55d000000000-55d000100000 rw-p 00000000 00:00 0                          [heap]
Pss:                 400 kB
Private_Dirty:       400 kB
7f0000300000-7f0000400000 rw-p 00000000 00:00 0
Pss:                  20 kB
Shared_Dirty:         40 kB
7f0000500000-7f0000600000 r-xp 00000000 fd:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
Pss:                  10 kB
"""


def test_smaps_groups_mappings_by_package_and_heap():
    groups = smaps.parse(SMAPS)
    assert groups["torch"] == {"pss": 300 * 1024, "private": 100 * 1024, "shared": 800 * 1024}
    assert groups["numpy"]["private"] == 50 * 1024  # numpy.libs counts with numpy
    assert groups[smaps.HEAP] == {"pss": 420 * 1024, "private": 400 * 1024, "shared": 40 * 1024}
    assert groups[smaps.SYSTEM]["pss"] == 10 * 1024
    assert [name for name, _ in smaps.top(groups, 2)] == [smaps.HEAP, "torch"]


def test_category_of_paths():
    assert (
        smaps.category("/v/lib/python3.11/site-packages/_brotli.cpython-311-x86_64.so") == "brotli"
    )
    assert smaps.category("/p/lib/python3.11/lib-dynload/_json.so") == smaps.PYTHON
    assert smaps.category("[anon:arena]") == smaps.HEAP
    assert smaps.category("/tmp/model.onnx") == smaps.OTHER


def test_bare_unwraps_one_known_wrapper_only():
    assert bare({"instances": [[1.0]]}) == [[1.0]]
    assert bare({"labels": ["a"]}) == ["a"]
    assert bare({"sepal": [[1]], "petal": [[2]]}) == {"sepal": [[1]], "petal": [[2]]}


def test_v2_request_and_answer():
    container = {"Image": "sklearn", "ModelDataUrl": "/m/hetero-wine-sklearn"}
    body = v2_request(container, [[1.5, 2.0]])
    assert body["inputs"][0] == {
        "name": "input-0",
        "shape": [1, 2],
        "datatype": "FP64",
        "data": [1.5, 2.0],
    }
    assert body["outputs"] == [{"name": "predict_proba"}]
    named = v2_request(
        {"Image": "onnx", "ModelDataUrl": "/m/x"}, {"sepal": [[1.0]], "petal": [[2.0]]}
    )
    assert [(i["name"], i["datatype"]) for i in named["inputs"]] == [
        ("sepal", "FP32"),
        ("petal", "FP32"),
    ]
    answer = {"outputs": [{"datatype": "INT64", "shape": [3, 1], "data": [0, 1, 2]}]}
    assert v2_answer(answer, [0, 1, 2]) == [0, 1, 2]  # MLServer's trailing axis dropped


def _scenario(pss_mib: int, idle: float, startup: float) -> dict:
    return {
        "total_pss": pss_mib * 2**20,
        "idle_cpu_cores": idle,
        "startup_s": startup,
        "answered": 15,
        "processes": [{}],
        "largest_packages": {smaps.HEAP: {"pss": 2**20, "private": 2**20, "shared": 0}},
        "outside_sharers": 0,
    }


def test_report_states_ratios_against_the_floor():
    results = {"floor": _scenario(800, 0.01, 5.0), "mlserver": _scenario(1200, 0.02, 7.5)}
    meta = {
        "command": "python -m loadtests.bench_density",
        "started": "2026-11-29T09:00:00Z",
        "duration_s": 60,
        "machine_before": {"load_average": [0.1], "cpus": 2, "memory_gib": 23.5},
        "machine_after": {"load_average": [0.2]},
        "versions": {"python": "3.11"},
    }
    section = report.docs_section(results, meta)
    assert "| 1,200 MiB | 0.020 | 1.5× | 2.0× | 1.5× | – |" in section
    # a floor idle of a few 10 ms ticks gives no idle ratio (it read 516× once)
    results["floor"]["idle_cpu_cores"] = 0.0003
    assert "| 1,200 MiB | 0.020 | 1.5× | – | 1.5× | – |" in report.docs_section(results, meta)
    assert "floor 0, mlserver 0" in section
