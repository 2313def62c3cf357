"""One protocol, one measuring function (issue 49, item 1): :class:`~timm_posgeom.protocol.Protocol` holds the
paper's defaults under one name per setting, :func:`~timm_posgeom.protocol.measure_model` composes the library's
functions, the registry of optional measures reaches every runner, and a zoo row and a study run of the same model,
data and protocol hold the same numbers bit for bit. (That each setting reaches each function it concerns:
tests/test_fault_options.py.)"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import timm
import torch

import timm_posgeom
from timm_posgeom import protocol as protocol_module
from timm_posgeom.errors import PosgeomError
from timm_posgeom.protocol import (
    DEFAULT_ALPHAS,
    PAPER_SHIFTS,
    Protocol,
    ProtocolError,
    measure_model,
    measure_names,
    register_measure,
)
from timm_posgeom.results.fingerprints import fingerprint

pytestmark = [pytest.mark.xdist_group("protocol"), pytest.mark.filterwarnings("ignore:clean accuracy is 0")]
IMG = 32


def _model(num_classes: int, seed: int = 2) -> torch.nn.Module:
    """A micro APE ViT at random init, its head drawn wide (N(0, 1)) so that its predictions vary with the image:
    on the first 16 synthetic images, clean top-1 1/16 and a blur FS of 1 (every number of the zoo-study
    comparison below finite, and not all zero)."""
    torch.manual_seed(seed)
    model = timm.create_model(
        "posgeom_vit_micro_patch8_64_ape", num_classes=num_classes, img_size=IMG, embed_dim=32, depth=2, num_heads=2
    ).eval()
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
        model.head.bias.zero_()
    return model


@pytest.fixture(scope="module")
def val() -> Any:
    from timm_posgeom.data import load_split

    return load_split("synthetic", "validation", synthetic_size=24, img_size=48)


@pytest.fixture(scope="module")
def export(tmp_path_factory, val) -> Path:
    """A micro APE model as ``posgeom train`` exports a run."""
    from timm_posgeom.app.hub import export_for_hub

    folder = tmp_path_factory.mktemp("run") / "export"
    args = dict(img_size=IMG, num_classes=val.num_classes, embed_dim=32, depth=2, num_heads=2)
    export_for_hub(_model(val.num_classes), folder, args)
    return folder


def test_the_defaults_are_the_papers():
    p = Protocol()
    assert p.alphas == DEFAULT_ALPHAS == (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)  # its appendix grid
    assert p.shifts == PAPER_SHIFTS == ("jpeg:5", "blur:2.5:5") and p.sweep_shifts == ("jpeg:5",)
    assert (p.probe_count(), p.rpi_permutations, p.reduction, p.site, p.resize) == (
        1000,
        10,
        "mean_map",
        "auto",
        "paper",
    )
    assert p.parts() == ("ssdc", "fragility", "alpha_sweep") and Protocol(alphas=()).parts() == ("ssdc", "fragility")
    assert (
        Protocol(max_images=300).probe_count() == 300
        and Protocol(max_images=300, probe_images=500).probe_count() == 500
    )
    assert json.loads(json.dumps(p.to_dict()))["alphas"] == list(DEFAULT_ALPHAS)
    assert set(measure_names()) >= {"attention", "attention_rpi", "position"}


@pytest.mark.parametrize(
    "setting, value, phrase",
    [
        ("max_images", 0, "max_images must be an integer >= 1"),
        ("probe_images", 2.5, "probe_images must be an integer >= 1"),
        ("rpi_permutations", None, "rpi_permutations must be an integer >= 1"),
        ("seed", True, "seed must be an integer"),
        ("alphas", ("a",), "alphas must be numbers"),
        ("alphas", (math.inf,), "alphas must be finite"),
        ("shifts", (), "shifts must be distinct and not empty"),
        ("labels", "by_name", "labels must be one of check, by-name, as-is"),
        ("reduction", "mean", "reduction must be one of mean_map, per_image, both"),
        ("extras", ("attention", "attention"), "extras must be distinct"),
        ("extras", ("bogus",), "unknown extras ['bogus']"),
        ("num_workers", -1, "num_workers must be an integer >= 0"),
    ],
)
def test_a_setting_no_measurement_can_follow_is_refused_in_one_line(setting, value, phrase):
    with pytest.raises(ProtocolError, match=phrase.replace("[", r"\[").replace("]", r"\]")) as e:
        Protocol(**{setting: value})
    assert isinstance(e.value, PosgeomError) and "\n" not in str(e.value)


def test_the_protocol_imports_no_torch():
    """``posgeom --help`` reads the protocol's defaults (cli/_options.py): its module stays light."""
    code = "import sys, timm_posgeom.protocol as p; p.Protocol(); print(sorted({'torch', 'timm'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_package_exports_the_protocol():
    for name in ("Protocol", "measure_model", "Measurement", "register_measure", "measure_names"):
        assert name in timm_posgeom.__all__ and getattr(timm_posgeom, name) is getattr(protocol_module, name)


@pytest.mark.slow
def test_measure_model_is_the_library_functions_composed(val):
    """measure_model's numbers are those of probe_ssdc, fragility and alpha_sweep called directly with the same
    settings: it composes them, it does not redo them."""
    from timm_posgeom.data.eval_data import eval_loader
    from timm_posgeom.probes import probe_ssdc
    from timm_posgeom.robustness import alpha_sweep, fragility

    p = Protocol(max_images=16, probe_images=8, rpi_permutations=2, alphas=(1.0, 0.5), batch_size=4, num_workers=0)
    model = _model(val.num_classes)
    measured = measure_model(model, val, p)
    common = dict(seed=0, rpi_permutations=2, device="cpu", progress=False)
    loader = eval_loader(model, val, max_images=8, batch_size=4, num_workers=0)
    rpi = probe_ssdc(model, loader, rpi=True, **common)
    frag = fragility(model, val, list(PAPER_SHIFTS), max_images=16, batch_size=4, num_workers=0, **common)
    sweep = alpha_sweep(model, val, (1.0, 0.5), probe_images=8, max_images=16, batch_size=4, num_workers=0, **common)
    assert measured.ssdc_rpi.per_layer == rpi.per_layer and measured.ssdc_rpi.per_layer_ci == rpi.per_layer_ci
    assert (measured.delta_ssdc, measured.delta_ssdc_ci) == (rpi.rise, tuple(rpi.delta_ci))
    assert (measured.top1, measured.top1_ci) == (frag.clean_accuracy, tuple(frag.clean_interval))
    assert measured.fragility.fs == frag.fs and measured.fragility.fs_interval == frag.fs_interval
    assert measured.alpha_sweep.delta_ssdc == sweep.delta_ssdc and measured.alpha_sweep.fs == sweep.fs
    assert measured.labels == "check" and not measured.notes
    assert next(model.parameters()).device.type == "cpu" and not model.training
    json.dumps(timm_posgeom.results.jsonio.to_jsonable(measured.to_dict()))  # every part JSON-ready


@pytest.mark.slow
def test_a_zoo_row_and_a_study_run_hold_the_same_numbers(tmp_path, val, export):
    """Issue 49: one model, one data, one protocol, measured by the zoo and by the study: SSDC and its intervals,
    delta SSDC, top-1, FS and the sweep are the same numbers, bit for bit."""
    from timm_posgeom.app.study import preset_config
    from timm_posgeom.app.study.measure import Measuring, eval_settings, measure_run
    from timm_posgeom.app.study.plan import PlannedRun
    from timm_posgeom.app.zoo import ZooConfig
    from timm_posgeom.app.zoo.measure import measure_model as measure_zoo_model

    same = dict(max_images=16, probe_images=8, sweep_images=16, alphas=(1.0, 0.5), rpi_permutations=2)
    same.update(batch_size=4, num_workers=0, device="cpu", extras=())
    study = preset_config("demo", **same)
    zoo = ZooConfig(
        data="synthetic",
        pretrained="off",
        labels="check",
        reduction="both",
        attention_layers=4,
        attention_images=256,
        **same,
    )
    assert zoo.protocol() == study.protocol("ape")
    row = measure_zoo_model(f"local-dir:{export}", zoo, val)
    run_dir = tmp_path / "runs" / "ape_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "export").symlink_to(export, target_is_directory=True)
    m = Measuring(config=study, val=val, settings=eval_settings(study, val), versions={}, log=lambda s: None)
    ev = measure_run(PlannedRun("ape", 0, run_dir, "x", (), None), m)  # type: ignore[arg-type]
    pairs = {
        "SSDC per layer": (row.ssdc, ev.ssdc.per_layer),
        "its intervals": (row.ssdc_ci, ev.ssdc.per_layer_ci),
        "rise": ((row.rise, row.rise_ci), (ev.ssdc.rise, ev.ssdc.rise_ci)),
        "SSDC under RPI": (row.rpi_ssdc, ev.ssdc.rpi_per_layer),
        "its intervals under RPI": (row.rpi_ssdc_ci, ev.ssdc.rpi_per_layer_ci),
        "delta SSDC": ((row.rpi_delta_ssdc, row.rpi_delta_ssdc_ci), (ev.ssdc.rpi_delta, ev.ssdc.rpi_delta_ci)),
        "top-1": ((row.clean_accuracy, row.accuracy, row.num_images), (ev.clean_accuracy, ev.accuracy, ev.num_images)),
        "FS": ((row.fs, row.fs_interval), (ev.fs, ev.fs_interval)),
        "the sweep": (row.alpha_sweep.to_dict(), ev.alpha_sweep.to_dict()),
    }
    for what, (zoo_number, study_number) in pairs.items():
        assert zoo_number == study_number, what
    numbers = [*row.ssdc, *row.rpi_ssdc, row.rpi_delta_ssdc, row.clean_accuracy, *row.fs.values()]
    assert all(isinstance(v, float) and math.isfinite(v) for v in numbers), numbers  # no equality of two Nones
    assert row.clean_accuracy > 0 and row.fs["blur:2.5:5"] > 0


@dataclass
class Toy:
    """A made-up optional measure's result: the mean of the first image's pixels, with an interval."""

    value: float

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "value_ci": [self.value - 1, self.value + 1]}


def _toy(model: Any, data: Any, protocol: Protocol) -> Toy:
    return Toy(float(protocol.probe_count()))


def _broken(model: Any, data: Any, protocol: Protocol) -> Toy:
    raise PosgeomError("no such thing in this model")


@pytest.fixture
def registry(monkeypatch):
    """The registry with two made-up measures, as a helper's new module would add them; restored afterwards."""
    monkeypatch.setattr(protocol_module, "_MEASURES", dict(protocol_module._MEASURES))
    register_measure("toy", _toy, "a made-up measure")
    register_measure("broken", _broken, "a measure that cannot apply here")
    with pytest.raises(ValueError, match="registered already"):
        register_measure("toy", _toy, "again")
    with pytest.raises(ValueError, match="a core part's"):
        register_measure("fragility", _toy, "no")


def test_a_registered_measure_is_measured_and_one_that_cannot_apply_gets_a_note(registry, val):
    measured = measure_model(
        _model(val.num_classes), val, Protocol(probe_images=5, extras=("toy", "broken")), parts=("toy", "broken")
    )
    assert measured.extras["toy"] == Toy(5.0) and "broken" not in measured.extras
    assert measured.notes == ["broken not measured: PosgeomError: no such thing in this model"]
    assert measured.to_dict()["extras"] == {"toy": {"value": 5.0, "value_ci": [4.0, 6.0]}}


@pytest.mark.slow
def test_every_runner_picks_up_a_registered_measure(registry, tmp_path, val, export):
    """One registry entry: the zoo's records, the study's eval.json and the command line's --extras have it."""
    from timm_posgeom.app.study import preset_config
    from timm_posgeom.app.study.measure import Measuring, eval_settings, measure_run
    from timm_posgeom.app.study.plan import PlannedRun
    from timm_posgeom.app.zoo import ZooConfig
    from timm_posgeom.app.zoo.measure import measure_model as measure_zoo_model
    from timm_posgeom.cli.main import build_parser
    from timm_posgeom.cli.zoo import zoo_config

    small = dict(max_images=8, probe_images=6, rpi_permutations=2, batch_size=4, num_workers=0, extras=("toy",))
    row = measure_zoo_model(f"local-dir:{export}", ZooConfig(data="synthetic", pretrained="off", **small), val)
    assert row.status == "ok" and row.measures == {"toy": Toy(6.0).to_dict()}
    study = preset_config("demo", **dict(small, sweep_images=8, alphas=(1.0,)))
    run_dir = tmp_path / "runs" / "nope_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "export").symlink_to(export, target_is_directory=True)
    m = Measuring(config=study, val=val, settings=eval_settings(study, val), versions={}, log=lambda s: None)
    ev = measure_run(PlannedRun("nope", 0, run_dir, "x", (), None), m)  # type: ignore[arg-type]
    assert ev.measures == {"toy": Toy(6.0).to_dict()} and ev.attention is None and ev.alpha_sweep is None
    args = build_parser().parse_args(["zoo", "M", "--data", "synthetic", "--extras", "toy,attention"])
    assert zoo_config(args, "off").protocol().extras == ("toy", "attention")


def test_the_studys_alpha_grid_is_the_protocols_and_the_cpu_presets_say_why_not():
    """One grid, the paper's: the study's default and the in100 preset (the paper's protocol) take the protocol's;
    the CPU presets keep their 7 alphas (alpha 0 included), with which every committed study was measured, and the
    demo its 3 (minutes)."""
    from timm_posgeom.app.study import PRESETS, StudyConfig, preset_config
    from timm_posgeom.app.study.config import CPU_ALPHAS

    assert StudyConfig.alphas == DEFAULT_ALPHAS and preset_config("in100").alphas == DEFAULT_ALPHAS
    assert "alphas" not in PRESETS["in100"] and preset_config("demo").alphas == (1.0, 0.5, 0.0)
    assert preset_config("imagenette-cpu").alphas == preset_config("imagenette-cpu-14").alphas == CPU_ALPHAS
    for plan in Path(__file__).parents[1].glob("experiments/scaling/*/plan.json"):
        assert tuple(json.loads(plan.read_text())["config"]["alphas"]) == CPU_ALPHAS, plan


def test_the_studys_former_names_still_read():
    """eval_images and workers are max_images and num_workers now: a study started before resumes without a
    change, its untrained SSDC found under the same key, and preset_config takes the old names for one release."""
    from timm_posgeom.app.study import config_changes, preset_config
    from timm_posgeom.app.study.measure import eval_settings

    config = preset_config("demo", max_images=8, num_workers=2)
    saved = {("eval_images" if k == "max_images" else "workers" if k == "num_workers" else k): v
             for k, v in dataclasses.asdict(config).items()}  # fmt: skip
    assert config_changes(saved, dataclasses.asdict(config)) == {}
    with pytest.warns(DeprecationWarning, match="eval_images"):
        assert preset_config("demo", eval_images=8).max_images == 8
    settings = eval_settings(config, range(60))
    assert settings["max_images"] == 8 and "eval_images" not in settings
    before = dict((("eval_images" if k == "max_images" else k), v) for k, v in settings.items())
    assert config_changes(before, settings) == {}


def _committed_study_config(root: Path) -> Any:
    """The StudyConfig of a committed study, as its plan.json records it, from the preset now."""
    from timm_posgeom.app.study import preset_config

    saved = json.loads((root / "plan.json").read_text())["config"]
    config = preset_config(
        saved["preset"],
        data=saved["data"],
        seeds=saved["seeds"],
        conditions=tuple(saved["conditions"]),
        init=saved["init"],
        heldout_fraction=saved["heldout_fraction"],
    )
    config.train_overrides = saved["train_overrides"]
    return config


def test_a_committed_study_resumes_without_a_change():
    """The committed 8 x 8 width-384 study (settings as recorded, old names included) against the preset now."""
    from timm_posgeom.app.study import config_changes
    from timm_posgeom.app.study.measure import eval_settings

    root = Path(__file__).parents[1] / "experiments" / "scaling" / "8x8-w384-lr3e-4-paper"
    if not (root / "plan.json").is_file():
        pytest.skip("the committed studies are not beside the tests (an installed wheel)")
    saved = json.loads((root / "plan.json").read_text())["config"]
    assert "eval_images" in saved and "workers" in saved  # recorded under the former names
    config = _committed_study_config(root)
    assert config_changes(saved, dataclasses.asdict(config)) == {}
    recorded = json.loads((root / "runs" / "ape_s0" / "eval.json").read_text())["settings"]
    assert config_changes(recorded, eval_settings(config, range(recorded["val_images"]))) == {}


def test_a_committed_studys_untrained_records_are_found_under_their_former_keys(tmp_path, monkeypatch):
    """The untrained SSDC was kept under a key of 10 hex digits (0.1.0); the key is now the one fingerprint (16).
    A resume of a copy of the committed 8 x 8 width-384 study finds every untrained record it holds and measures
    none again (a model built would fail here); a record measured now goes under the full key."""
    from timm_posgeom.app.records import SSDCSummary
    from timm_posgeom.app.study import measure as M
    from timm_posgeom.app.study.plan import make_plan

    committed = Path(__file__).parents[1] / "experiments" / "scaling" / "8x8-w384-lr3e-4-paper"
    if not (committed / "plan.json").is_file():
        pytest.skip("the committed studies are not beside the tests (an installed wheel)")
    out = tmp_path / "study"
    shutil.copytree(committed / "untrained", out / "untrained")
    config = _committed_study_config(committed)
    recorded = json.loads((committed / "runs" / "ape_s0" / "eval.json").read_text())["settings"]
    m = M.Measuring(
        config=config, val=None, settings=M.eval_settings(config, range(recorded["val_images"])), versions={}, log=print
    )

    def no_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an untrained model measured again")

    runs = make_plan(config, out).runs
    monkeypatch.setattr(timm, "create_model", no_model)
    assert len(runs) == 2
    for run in runs:
        path = M.untrained_path(run, m, out)
        assert len(path.stem.rsplit("-", 1)[1]) == 10  # the former key, found
        assert M.untrained_ssdc(run, m, out) == SSDCSummary.read(committed / "untrained" / path.name)
        path.unlink()  # gone: measured now, under the one fingerprint
        assert len(M.untrained_path(run, m, out).stem.rsplit("-", 1)[1]) == 16


def test_the_untrained_key_is_computed_on_the_names_it_was_first_recorded_with(tmp_path, monkeypatch):
    """The untrained SSDC of a study is kept under a hash of its settings: renaming eval_images must not change
    it (a resumed study would measure every untrained model again)."""
    from timm_posgeom.app.study import measure as M

    settings = {"data": "synthetic", "max_images": 8, "probe_images": 4}
    recipe = {"model": "m"}
    old = {"data": "synthetic", "eval_images": 8, "probe_images": 4}
    key = fingerprint(json.dumps(dict(old, recipe=recipe), sort_keys=True))

    class Run:
        condition, seed = "ape", 0

        class recipe:  # noqa: N801
            @staticmethod
            def to_dict() -> dict[str, str]:
                return {"model": "m"}

    kept = tmp_path / "untrained" / f"ape_s0-{key}.json"
    kept.parent.mkdir()
    M.SSDCSummary(
        n_images=4, per_layer=[0.5], rise=None, rpi_per_layer=[0.0], rpi_delta=None, rpi_content_per_layer=[]
    ).write(kept)
    m = M.Measuring(config=None, val=None, settings=settings, versions={}, log=print)  # type: ignore[arg-type]
    assert M.untrained_ssdc(Run(), m, tmp_path).per_layer == [0.5]  # type: ignore[arg-type]


def test_a_measure_named_by_its_module_is_imported_when_it_measures(registry, val):
    """A measure of the package is registered by ``"module:function"``: the registry imports nothing heavy."""
    register_measure("toy_by_name", "test_protocol:_toy", "the toy, by its name")
    with pytest.raises(ValueError, match="'module:function'"):
        register_measure("bad_name", "test_protocol._toy", "no colon")
    measured = measure_model(_model(val.num_classes), val, Protocol(probe_images=3), parts=("toy_by_name",))
    assert measured.extras["toy_by_name"] == Toy(3.0)


@pytest.mark.slow
def test_a_zoo_measured_before_the_protocol_resumes_without_measuring_again(tmp_path, export):
    """Records written before the zoo's settings were the protocol's lack sweep_images, reduction and the
    attention settings: a rerun with the same flags keeps them (compared as they were then), it measures nothing."""
    from timm_posgeom.app.records import ZooIndex, ZooModel
    from timm_posgeom.app.zoo import ZooConfig, run_zoo, safe_name

    name, out = f"local-dir:{export}", tmp_path / "zoo"
    config = ZooConfig(data="synthetic", pretrained="off", max_images=8, probe_images=4, extras=(), num_workers=0)
    first = run_zoo([name], config, out, progress=False, log=lambda s: None)
    assert first.measured == [name]
    new = ("sweep_images", "reduction", "attention_layers", "attention_images")
    record_path = out / "models" / f"{safe_name(name)}.json"
    record = ZooModel.read(record_path)
    record.settings = {k: v for k, v in record.settings.items() if k not in new}
    record.write(record_path)
    index = ZooIndex.read(out / "zoo.json")
    ZooIndex(settings={k: v for k, v in index.settings.items() if k not in new}, models=index.models).write(
        out / "zoo.json"
    )
    again = run_zoo([name], config, out, progress=False, log=lambda s: None)
    assert again.measured == [] and again.skipped == [name] and not list(out.glob("models/*.replaced-*"))


@pytest.mark.slow
def test_a_zoo_record_under_its_former_name_is_kept_then_replaced_under_the_new(tmp_path, export):
    """0.1.0 named a local-dir: or hf-hub: model's record with 8 hex digits of its name's SHA-1; the name now ends in
    the one fingerprint (16). A rerun finds the record under the former name and measures nothing; measured
    again (other settings, allowed), the record is written under the new name, the former set aside."""
    from timm_posgeom.app.zoo import ZooConfig, run_zoo, safe_name

    name, out = f"local-dir:{export}", tmp_path / "zoo"
    config = ZooConfig(data="synthetic", pretrained="off", max_images=8, probe_images=4, extras=(), num_workers=0)
    assert run_zoo([name], config, out, progress=False, log=lambda s: None).measured == [name]
    new = out / "models" / f"{safe_name(name)}.json"
    former = new.with_name(f"{safe_name(name).rsplit('-', 1)[0]}-{fingerprint(name)[:8]}.json")
    new.rename(former)
    again = run_zoo([name], config, out, progress=False, log=lambda s: None)
    assert again.measured == [] and again.skipped == [name] and again.records[0].status == "ok"
    other = dataclasses.replace(config, probe_images=3)
    third = run_zoo([name], other, out, allow_changes=True, progress=False, log=lambda s: None)
    assert third.measured == [name] and new.is_file() and not former.exists()
    assert former.with_name(former.name + ".replaced-1").is_file()  # the former record, kept aside


PACKAGE_MEASURES = (
    "pe_shuffle",
    "pe_shift",
    "tile_shuffle",
    "extrapolation",
    "activation_patching",
    "pe_imprint",
    "position_ablation",
    "encoding_cka",
)


@pytest.mark.slow
def test_the_packages_measures_plug_into_the_protocol(val):
    """Resolution extrapolation, the PE interventions and the localisation measures are entries of the registry:
    `Protocol(extras=...)` measures each through `measure_model` on a tiny APE ViT into a JSON-able result (under
    the protocol's seed, permutations and images: the same numbers twice), none refused."""
    assert set(PACKAGE_MEASURES) <= set(measure_names())
    protocol = Protocol(
        extras=PACKAGE_MEASURES, alphas=(), max_images=8, probe_images=8, rpi_permutations=2, batch_size=8
    )
    model = _model(val.num_classes)
    first = measure_model(model, val, protocol, parts=PACKAGE_MEASURES)
    assert not first.notes, first.notes
    assert set(first.extras) == set(PACKAGE_MEASURES)
    dicts = {name: first.extras[name].to_dict() for name in PACKAGE_MEASURES}
    for name, record in dicts.items():
        assert json.loads(json.dumps(record, default=str)), name
    again = measure_model(model, val, protocol, parts=("pe_shuffle", "pe_imprint"))
    for name in ("pe_shuffle", "pe_imprint"):
        assert json.dumps(again.extras[name].to_dict(), default=str) == json.dumps(dicts[name], default=str), name
