"""`gpus = N` of an experiment and the command placeholders that go with it (`{gpus}`,
`{devices}`): parsed, rendered, refused with a clear error where wrong (app/projects/config.py,
command.py; docs/design.md, "Jobs of several GPUs")."""

from __future__ import annotations

import pytest

from app.projects import command
from app.projects.config import ConfigError, parse

CONFIG = """
[project]
name = "ddp"

[experiments.train]
kind = "command"
command = ["torchrun", "--standalone", "--nproc_per_node={gpus}", "train.py", "--devices={devices}", "--bs={@NAME@}"]
metric_source = "wall"
@GPUS@

[experiments.train.parameters]
@NAME@ = [16, 32]

[experiments.train.defaults]
@NAME@ = 16
"""


def config(gpus: str = "gpus = 2", name: str = "bs") -> str:
    return CONFIG.replace("@GPUS@", gpus).replace("@NAME@", name)


def test_gpus_defaults_to_one_and_renders_the_count_and_the_ordinals() -> None:
    assert parse(config(gpus="")).experiment("train").gpus == 1
    exp = parse(config()).experiment("train")
    assert exp.gpus == 2
    argv = command.render(exp.command, {"bs": 32}, "cuda:0", exp.gpus)
    assert argv == [
        "torchrun", "--standalone", "--nproc_per_node=2", "train.py", "--devices=0,1", "--bs=32",
    ]  # fmt: skip
    assert command.render(["{gpus}", "{devices}"], {}, "cpu") == ["1", "0"]


@pytest.mark.parametrize("value", ["0", "-1", "65", "1.5", '"two"'])
def test_a_bad_gpu_count_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(config(gpus=f"gpus = {value}"))
    assert "gpus" in str(caught.value.detail)


@pytest.mark.parametrize("name", ["gpus", "devices", "device"])
def test_a_parameter_may_not_take_a_reserved_name(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(config(name=name))
    assert f"parameter '{name}' has a reserved name" in str(caught.value.detail)
