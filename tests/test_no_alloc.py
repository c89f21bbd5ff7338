"""train_step allocates no heap memory after its first calls (checked by a counting allocator)."""

import subprocess

import pytest
import torch

import rootclad
from rootclad.toolchain import find_clad, find_cxx

SRC = __file__.replace("test_no_alloc.py", "cpp/test_no_alloc.cpp")


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    cxx, _ = find_cxx()
    exe = tmp_path_factory.mktemp("alloc") / "test_no_alloc"
    cmd = [cxx, "-O1", "-std=c++17", f"-I{rootclad.get_include()}", "-rdynamic", SRC,
           "-o", str(exe), "-ldl", "-pthread"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def _cnn():
    # the second Conv1d (64 taps, then a max-pool) takes the sparse backward pass
    nn = torch.nn
    return nn.Sequential(nn.Conv1d(1, 8, 8), nn.ReLU(), nn.MaxPool1d(4), nn.Conv1d(8, 8, 8),
                         nn.MaxPool1d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(1),
                         nn.Dropout(0.1))  # fmt: skip


class _Graph(torch.nn.Module):
    """A graph, not a chain: a residual block, a concatenation, LayerNorm and global pooling."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Conv1d(1, 4, 5, padding=2)
        self.conv = nn.Conv1d(4, 4, 5, padding=2)
        self.gap = nn.AdaptiveAvgPool1d(1)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = h + self.conv(h)
        g = torch.cat([self.gap(h).flatten(1), self.gap(-h).flatten(1)], dim=1)
        return self.head(torch.nn.functional.silu(self.norm(g)))


MODELS = {"cnn": _cnn, "graph": _Graph}


def _run(counter, cm, batch):
    out = subprocess.run([str(counter), str(cm.library_path), cm._em.prefix, str(batch)],
                         capture_output=True, text=True)  # fmt: skip
    return out.returncode, out.stdout + out.stderr


ENGINES = ["pullback", pytest.param("clad", marks=pytest.mark.clad)]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("batch", [1, 16])
def test_train_step_allocates_nothing_after_warmup(counter, engine, batch, model):
    if engine == "clad" and find_clad()[0] is None:
        pytest.skip(f"Clad not installed: {find_clad()[1]}")
    x = torch.randn(batch, 1, 256)
    net = MODELS[model]()
    net(x)
    cm = rootclad.compile(net, x, "bce_with_logits", engine=engine)
    code, out = _run(counter, cm, batch)
    assert code == 0, out
    assert "allocations in 21 steady-state steps: 0" in out


def test_counter_sees_allocations(counter, tmp_path):
    """The counting allocator must notice an allocating train_step (else the test above is void)."""
    src = tmp_path / "alloc_model.cpp"
    p = "rc_alloc_probe"
    api = "\n".join(
        [
            "#include <cstdint>",
            "#include <vector>",
            'extern "C" {',
            f"long {p}_n_params() {{ return 1; }}",
            f"long {p}_act_size(int B) {{ return B; }}",
            f"long {p}_d_act_size(int B) {{ return B; }}",
            f'const char* {p}_engine() {{ return "probe"; }}',
            f'const char* {p}_dtype() {{ return "float32"; }}',
            f'const char* {p}_loss() {{ return "mse"; }}',
            f"long {p}_input_offset() {{ return 0; }}",
            f"long {p}_input_size() {{ return 1; }}",
            f"long {p}_output_offset() {{ return 0; }}",
            f"long {p}_output_size() {{ return 1; }}",
            "static const long one[1] = {1};",
            f"const long* {p}_input_shape(int* n) {{ *n = 1; return one; }}",
            f"const long* {p}_output_shape(int* n) {{ *n = 1; return one; }}",
            f"int {p}_param_count() {{ return 1; }}",
            f'const char* {p}_param_name(int) {{ return "w"; }}',
            f"long {p}_param_offset(int) {{ return 0; }}",
            f"long {p}_param_numel(int) {{ return 1; }}",
            f"const long* {p}_param_shape(int, int* n) {{ *n = 1; return one; }}",
            f"void {p}_forward(float*, float*, int, int, std::uint64_t) {{}}",
            f"float {p}_loss_value(float*, const float*, int) {{ return 0; }}",
            f"float {p}_loss_and_grad(float*, float*, const float*, float*, float*, int, int, "
            "std::uint64_t, int) { return 0; }",
            f"void {p}_vjp(float*, float*, float*, float*, const float*, int, int, std::uint64_t,"
            " int) {}",
            f"float {p}_train_step(float*, float*, const float*, float*, float*, float*, "
            "const double*, long, int B, std::uint64_t) {",
            "  std::vector<float> waste(B + 1000); return waste[0]; }",  # allocates every call
            "}",
        ]
    )
    src.write_text(api + "\n")
    lib = tmp_path / "libprobe.so"
    cxx, _ = find_cxx()
    subprocess.run([cxx, "-shared", "-fPIC", "-O1", str(src), "-o", str(lib)], check=True)

    class Probe:
        library_path = lib
        _em = type("E", (), {"prefix": p})

    code, out = _run(counter, Probe, 4)
    assert code == 1, out
    assert "allocations in 21 steady-state steps: 0" not in out
