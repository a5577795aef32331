"""Recipes and target profiles as hostile input: every file gives a valid configuration or a named
ConfigError (file:line:column, field, fix), quickly and before any expensive work."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH
from edgekit.errors import EdgekitError, RecipeError, TargetError
from edgekit.recipe import Recipe, load_recipe
from edgekit.target import load_target_file
from tests.conftest import TINY_RECIPE

TINY = TINY_RECIPE.format(factory="tiny_net")
FACTORY_LINES = "kind: factory\n  factory: tests.fixtures.tiny_models:tiny_net"
TARGETS = Path(__file__).resolve().parent.parent / "targets"


def alias_bomb(levels: int = 9) -> str:
    """The billion-laughs shape: each anchor is a list of nine aliases of the one before (9**levels strings)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def load_error(path: Path, error: type[EdgekitError] = RecipeError) -> str:
    with pytest.raises(error) as info:
        load_recipe(path) if error is RecipeError else load_target_file(path)
    return str(info.value)


# ---------------------------------------------------------------- the YAML reader's limits


def test_alias_bomb_is_refused_in_bounded_time_and_memory(tiny_recipe):
    text = alias_bomb()
    assert len(text) < 2600  # 2.5 KB that expands to 387 million strings
    path = tiny_recipe(text=text + TINY)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    message = load_error(path)
    assert time.perf_counter() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200_000  # KiB: under 200 MB grown
    assert "alias bomb" in message and "100,000 values" in message
    assert f"{path}:6:10: alias *l4 makes the document larger" in message  # the second alias on the l5 line


def test_recursive_alias_is_named(tiny_recipe):
    message = load_error(tiny_recipe(text="name: tiny\nkwargs: &loop\n  again: *loop\n"))
    assert "alias *loop is inside the collection &loop it refers to (a recursive alias)" in message
    assert ":3:10:" in message


def test_an_alias_to_a_scalar_or_small_list_still_works(tiny_recipe):
    text = TINY.replace("name: tiny", "name: &n tiny\ndescription: *n").replace(
        "  samples: {callable: \"tests.fixtures.tiny_models:tiny_batches\"}",
        "  samples: &s {callable: \"tests.fixtures.tiny_models:tiny_batches\"}\n  calibration: *s",
    )
    recipe = load_recipe(tiny_recipe(text=text))
    assert recipe.description == "tiny" and recipe.data.calibration == recipe.data.samples


def test_deep_nesting_is_refused_before_it_recurses(tiny_recipe):
    deep = 100_000
    message = load_error(tiny_recipe(text="name: tiny\nkwargs: " + "[" * deep + "]" * deep + "\n"))
    assert f"nests deeper than {MAX_CONFIG_DEPTH} levels" in message and ":2:" in message


def test_deep_nesting_through_aliases_is_refused(tiny_recipe):
    chain = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [[[[[[[[*a{i - 1}]]]]]]]]" for i in range(1, 8)]
    message = load_error(tiny_recipe(text="\n".join(chain) + "\n"))
    assert "alias *a5 nests deeper than" in message and "aliases expanded" in message


def test_non_utf8_bytes_name_the_byte_offset(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(TINY.encode().replace(b"name: tiny", b"name: tiny\ndescription: caf\xe9"))
    message = load_error(path)
    assert f"{path}:2:17: byte 0xe9 at byte offset 27 is not UTF-8" in message
    assert "save the recipe as UTF-8" in message


def test_control_characters_are_named(tiny_recipe):
    message = load_error(tiny_recipe(text=TINY.replace("name: tiny", "name: ti\x07ny")))
    assert ":1:9: character U+0007 at character offset 8 is not allowed in YAML" in message


def test_an_oversized_file_is_refused_before_it_is_parsed(tiny_recipe):
    message = load_error(tiny_recipe(text=TINY + "#" * MAX_CONFIG_BYTES + "\n"))
    assert f"configuration files are read up to {MAX_CONFIG_BYTES:,} bytes" in message


def test_unreadable_tagged_values_are_named(tiny_recipe):
    message = load_error(tiny_recipe(text=TINY.replace("name: tiny", "name: tiny\ndescription: 2024-02-30")))
    assert ":2:14:" in message and "cannot read this timestamp value: day is out of range for month" in message
    message = load_error(tiny_recipe(text=TINY.replace("name: tiny", "name: !!int twelve")))
    assert ":1:7:" in message and "cannot read this int value" in message


def test_a_collection_as_a_key_is_named(tiny_recipe):
    message = load_error(tiny_recipe(text=TINY + "? [a, b]\n: 1\n"))
    assert "a list is used as a mapping key" in message


# ---------------------------------------------------------------- values checked at load time


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("{min: 1, opt: 4, max: 8}", "{min: 1, opt: 4, max: 100000000000000000000}", r"dims\.batch\.max.*less than or equal to 2147483647"),
        ("{min: 1, opt: 4, max: 8}", "{min: 1, opt: 4, max: 1000000000}", r":11:27: field 'dims\.batch\.max': one batch of inputs at the max shape takes 59\.6 GiB \(input 'image' \[1000000000, 1, 4, 4\] float32.*lower dims\.batch\.max \(1000000000\)"),
        ("[batch, 1, 4, 4]", "[batch, 1, 40000, 40000]", r"takes 47\.7 GiB.*lower dims\.batch\.max \(8\)"),
        ("[batch, 1, 4, 4]", "[batch, 1, 4, 4000000000]", r"fixed dimension 4000000000 is larger than 2147483647"),
        ("[batch, 1, 4, 4]", "[batch, 1, 4, 0]", r"fixed dimensions must be >= 1, got 0"),
        ("{min: 1, opt: 4, max: 8}", "{min: 1, opt: 9, max: 8}", r"need min <= opt <= max"),
        ("dtype: float32", "dtype: float33", r"inputs\[0\]\.dtype.*'float32'.*float33"),
        ("dtype: float32", "dtype: float32\n    low: 1.0\n    high: 0.5", r":9:5: field 'inputs\[0\]\.high': input 'image': need low < high, got low=1\.0 high=0\.5$"),
        ("dtype: float32", "dtype: float16\n    low: -1.0e+6", r"low -1e\+06 does not fit float16"),
        ("dtype: float32", "dtype: uint8\n    low: 0\n    high: 1000", r"high 1000 does not fit uint8 \(0 \.\. 256\)"),
        ("dtype: float32", "dtype: int32\n    low: 0.5\n    high: 3", r"int32: low must be a whole number, got 0.5"),
        ("dtype: float32", "dtype: bool\n    high: 1", r"bool: low/high do not apply"),
        ("dtype: float32", "dtype: float32\n    low: .nan", r"inputs\[0\]\.low.*finite number"),
        ("dtype: float32", "dtype: float32\n    high: .inf", r"inputs\[0\]\.high.*finite number"),
        ("outputs: [logits]", "outputs: [../../etc/passwd]", r"outputs\[0\].*should match pattern"),
        ("name: tiny", "name: ../../x", r"field 'name'.*should match pattern"),
        ("name: tiny", "name: " + "a" * 101, r"field 'name'.*at most 100 characters"),
        ("benchmark: {warmup: 1, iterations: 5}", "benchmark: {warmup: 1, iterations: 5000000000}", r"build\.benchmark\.iterations.*less than or equal to 1000000"),
        ("benchmark: {warmup: 1, iterations: 5}", "benchmark: {dims: {batch: 9}}", r"field 'build\.benchmark\.dims\.batch': 9 is outside dims\.batch \(1 \.\. 8\)"),
        ("benchmark: {warmup: 1, iterations: 5}", "benchmark: {dims: {seq: 9}}", r"field 'build\.benchmark\.dims\.seq': 'seq' is not a dynamic dim"),
        ("build:\n", "export: {parity: {random_inputs: 1000000000, seed: -1}}\nbuild:\n", r"(?s)export\.parity\.random_inputs.*1000.*export\.parity\.seed"),
    ],
)
def test_malformed_values_are_named_at_load_time(tiny_recipe, old, new, expected):
    assert old in TINY
    path = tiny_recipe(text=TINY.replace(old, new))
    start = time.perf_counter()
    message = load_error(path)
    assert time.perf_counter() - start < 2  # refused while loading, before any export or allocation
    assert message.startswith("invalid recipe:\n" + str(path) + ":")
    assert re.search(expected, message, re.MULTILINE), message
    assert "after validation" not in message  # no echo of the failed item as an empty tuple


def test_a_big_but_sane_recipe_loads(tiny_recipe):
    text = TINY.replace("{min: 1, opt: 4, max: 8}", "{min: 1, opt: 4, max: 64}").replace("[batch, 1, 4, 4]", "[batch, 3, 1024, 1024]")
    recipe = load_recipe(tiny_recipe(text=text))
    assert recipe.shape_at(recipe.inputs[0], "max") == (64, 3, 1024, 1024)  # 768 MiB at the max shape


# ---------------------------------------------------------------- target profiles


def test_target_profile_alias_bomb_and_bad_values(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert "alias bomb" in load_error(bomb, TargetError)
    shipped = (TARGETS / "x86-64-cpu.yaml").read_text()
    for old, new, expected in [
        ("cores: ", "cores: 100000000000 #", "cpu.cores"),
        ("gb: ", "gb: .nan #", "memory.gb"),
        ("name: x86-64-cpu", "name: ../x86-64-cpu", "field 'name'"),
    ]:
        assert old in shipped
        path = tmp_path / "x86-64-cpu.yaml"
        path.write_text(shipped.replace(old, new, 1))
        message = load_error(path, TargetError)
        assert expected in message and f"{path}:" in message, message


# ---------------------------------------------------------------- fuzzing: a Recipe or an EdgekitError, nothing else

YAML_PIECES = st.sampled_from(
    ["name: tiny", "&a", "*a", "&b [1, 2]", "*b", "<<: *a", "- ", "? ", ": ", "{", "}", "[", "]", ",", "!!int x",
     "!!float", "!!timestamp 2024-02-30", "!!binary", "!!python/object:os.system", "'", '"', "\\x00", "\x07", "\t",
     "\n", "  ", "dims:", "batch: {min: 1, opt: 4, max: 8}", "max: 1e20", "low: .nan", "%YAML 1.1", "---", "...",
     "#", "|", ">", "1e400", "-0", "0x1F", "~", "null", "yes", "\ufeff", "\u2028", "é"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(YAML_PIECES, max_size=30), insert_at=st.integers(0, len(TINY)))
def test_fuzzed_yaml_gives_a_recipe_or_an_edgekit_error(tiny_recipe, pieces, insert_at):
    text = TINY[:insert_at] + " ".join(pieces) + TINY[insert_at:]
    path = tiny_recipe(text=text)
    try:
        assert isinstance(load_recipe(path), Recipe)
    except EdgekitError as err:
        assert str(path) in str(err)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
RECIPE_PATHS = st.sampled_from(
    ["name", "inputs", "inputs.0", "inputs.0.shape", "inputs.0.shape.0", "inputs.0.low", "inputs.0.dtype", "dims",
     "dims.batch", "dims.batch.max", "outputs", "outputs.0", "data", "data.samples", "evaluation", "evaluation.budget",
     "build", "build.benchmark", "build.benchmark.dims", "export", "overrides", "model", "model.kwargs",
     "overrides.x86-64-cpu", "overrides.x86-64-cpu.build", "overrides.x86-64-cpu.build.prune", "overrides.x86-64-cpu.export"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=RECIPE_PATHS, value=JSON_VALUES)
def test_fuzzed_values_give_a_recipe_or_an_edgekit_error(tiny_recipe, where, value):
    data = yaml.safe_load(TINY)
    node, *parts = where.split(".")
    holder, key = data, node
    for part in parts:
        holder = holder.setdefault(key, {}) if isinstance(holder, dict) else holder[key]
        key = int(part) if isinstance(holder, list) else part
    holder[key] = value
    path = tiny_recipe(text=json.dumps(data))  # JSON is YAML
    try:
        recipe = load_recipe(path)
        for target in recipe.overrides:
            assert isinstance(recipe.for_target(target), Recipe)
    except EdgekitError as err:
        assert str(path) in str(err)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_model_path_to_a_device_is_refused_at_load_time(tiny_recipe, tmp_path, device):
    link = tmp_path / "model.onnx"
    link.symlink_to(device)
    for target in (device, "model.onnx"):  # named directly, or through a link next to the recipe
        path = tiny_recipe(text=TINY.replace(FACTORY_LINES, f"kind: onnx\n  path: {target}"))
        message = load_error(path)
        assert f"{path}:4:3: field 'model.path': '{target}' is not a regular file or folder" in message


def test_a_data_folder_that_is_a_fifo_is_refused(tiny_recipe, tmp_path):
    os.mkfifo(tmp_path / "batches")
    text = TINY.replace('samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}', "samples: {npz_dir: batches}")
    message = load_error(tiny_recipe(text=text))
    assert "field 'data.samples.npz_dir': 'batches' is not a regular file or folder" in message


TARGET_PATHS = st.sampled_from(
    ["name", "cpu", "cpu.cores", "cpu.isa", "cpu.arch", "gpu", "gpu.compute_capability", "memory", "memory.gb", "dla_cores",
     "npu", "peak_throughput", "power_modes", "software", "backends", "backends.0", "backends.0.precisions",
     "backends.0.execution_providers", "backends.0.execution_providers.0.options", "build", "build.opset", "build.max_batch"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=TARGET_PATHS, value=JSON_VALUES)
def test_fuzzed_target_profiles_give_a_profile_or_a_target_error(tmp_path, where, value):
    data = yaml.safe_load((TARGETS / "jetson-orin-nano-8gb.yaml").read_text())
    holder, key = data, None
    *parents, last = where.split(".")
    for part in parents:
        holder = holder[int(part)] if isinstance(holder, list) else holder.setdefault(part, {})
        if not isinstance(holder, (dict, list)):
            return
    if isinstance(holder, list):
        holder[int(last)] = value
    else:
        holder[last] = value
    path = tmp_path / "jetson-orin-nano-8gb.yaml"
    path.write_text(json.dumps(data))
    try:
        profile = load_target_file(path)
        profile.precisions(), profile.default_backend  # noqa: B018
    except TargetError as err:
        assert str(path) in str(err)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400), insert_at=st.integers(0, len(TINY)))
def test_fuzzed_bytes_give_a_recipe_or_an_edgekit_error(tmp_path, data, insert_at):
    path = tmp_path / "bytes.yaml"
    path.write_bytes(TINY.encode()[:insert_at] + data + TINY.encode()[insert_at:])
    try:
        assert isinstance(load_recipe(path), Recipe)
    except EdgekitError as err:
        assert str(path) in str(err)


def test_the_recipe_hash_is_of_the_bytes_validated(tiny_recipe):
    path = tiny_recipe()
    assert load_recipe(path).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("key", ["path", "sha256"])
def test_a_top_level_loader_field_in_the_yaml_is_refused(tmp_path: Path, key):
    """`path` and `sha256` are set by the loader from the file it reads; in the YAML they were silently overwritten."""
    from edgekit.recipe import load_recipe

    text = (Path(__file__).parents[1] / "recipes" / "digits-cnn.yaml").read_text()
    path = tmp_path / "digits-cnn.yaml"
    path.write_text(f"{key}: somewhere/else.onnx\n" + text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert f"'{key}' is not a recipe key: edgekit sets it from the file it loads" in info.value.message
    assert str(path) in info.value.message
