"""Zero-config checkpoint discovery: each layout written by its real writer (torch.save, safetensors,
torch.distributed.checkpoint), complete and torn; the crash-loop fallback rule scripted as data."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from spx.daemon.contract import checkpoint_discovery as cd
from spx.daemon.contract import checkpoint_layout as cl
from spx.daemon.lifecycle import resume_fallback as rf
from spx.trainer import layout_writer as lw

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state() -> dict:
    return {"w": torch.arange(64, dtype=torch.float32), "step": torch.tensor(3)}


def truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def hf_checkpoint(base: Path, step: int, *, trainer_state: bool = True, weights: str = "safetensors") -> Path:
    d = base / f"checkpoint-{step}"
    d.mkdir()
    if weights == "safetensors":
        save_file({"w": torch.zeros(32)}, d / "model.safetensors")
    elif weights == "bin":
        torch.save(state(), d / "pytorch_model.bin")
    elif weights == "sharded":
        save_file({"a": torch.zeros(8)}, d / "model-00001-of-00002.safetensors")
        save_file({"b": torch.zeros(8)}, d / "model-00002-of-00002.safetensors")
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    torch.save({"opt": torch.zeros(4)}, d / "optimizer.pt")
    if trainer_state:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return d


def deepspeed_tag(base: Path, step: int) -> Path:
    d = base / f"global_step{step}"
    d.mkdir()
    torch.save(state(), d / "mp_rank_00_model_states.pt")
    torch.save({"opt": torch.zeros(4)}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    return d


def chosen(tmp_path: Path, pattern: str | None = None) -> cd.Discovery:
    return cd.discover(tmp_path, pattern)


def skipped(found: cd.Discovery) -> dict[str, str]:
    return {c.name: c.problem or "" for c in found.skipped}


# --- one layout at a time -----------------------------------------------------------------------------


def test_seed_files_truncated_newest_resumes_the_older_complete_one(tmp_path):
    for e, s in ((0, 100), (1, 200), (1, 300)):
        torch.save(state(), tmp_path / f"checkpoint_epoch{e}_step{s}.pt")
    truncate(tmp_path / "checkpoint_epoch1_step300.pt")
    found = chosen(tmp_path)
    assert found.chosen.name == "checkpoint_epoch1_step200.pt" and found.chosen.step == 200
    assert found.layout == "epoch-step" and [c.name for c in found.older] == ["checkpoint_epoch0_step100.pt"]
    assert "truncated" in skipped(found)["checkpoint_epoch1_step300.pt"]


def test_seed_epoch_orders_before_step(tmp_path):
    torch.save(state(), tmp_path / "checkpoint_epoch2_step10.pt")
    torch.save(state(), tmp_path / "checkpoint_epoch1_step900.pt")
    assert chosen(tmp_path).chosen.name == "checkpoint_epoch2_step10.pt"


def test_a_zip_without_torchs_pickle_is_not_a_checkpoint(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "ckpt.pt", "w") as z:
        z.writestr("notes.txt", "hi")
    found = chosen(tmp_path)
    assert found.chosen is None and "without data.pkl" in skipped(found)["ckpt.pt"]


def test_nanogpt_ckpt_pt_complete_and_torn(tmp_path):
    torch.save({"model": state(), "iter_num": 5}, tmp_path / "ckpt.pt")
    found = chosen(tmp_path)
    assert found.chosen.name == "ckpt.pt" and found.chosen.step is None and found.layout == "nanogpt"
    truncate(tmp_path / "ckpt.pt", 0.9)
    found = chosen(tmp_path)
    assert found.chosen is None and found.layout == "nanogpt" and "truncated" in skipped(found)["ckpt.pt"]


def test_hf_checkpoint_without_trainer_state_is_passed_over(tmp_path):
    hf_checkpoint(tmp_path, 40)
    hf_checkpoint(tmp_path, 60, trainer_state=False)
    found = chosen(tmp_path)
    assert found.chosen.name == "checkpoint-40" and found.chosen.step == 40 and found.layout == "hf-trainer"
    assert skipped(found) == {"checkpoint-60": "no trainer_state.json (the Trainer writes it last)"}


@pytest.mark.parametrize("weights", ["safetensors", "bin", "sharded"])
def test_hf_checkpoint_weights_of_each_kind(tmp_path, weights):
    hf_checkpoint(tmp_path, 10, weights=weights)
    assert chosen(tmp_path).chosen.name == "checkpoint-10"


def test_hf_checkpoint_torn_weights_or_state(tmp_path):
    hf_checkpoint(tmp_path, 10)
    truncate(hf_checkpoint(tmp_path, 20) / "model.safetensors", 0.8)
    (hf_checkpoint(tmp_path, 30) / "trainer_state.json").write_text('{"global_step": 3')
    sharded = hf_checkpoint(tmp_path, 40, weights="sharded")
    (sharded / "model-00002-of-00002.safetensors").unlink()
    hf_checkpoint(tmp_path, 50, weights="none")
    found = chosen(tmp_path)
    assert found.chosen.name == "checkpoint-10"
    why = skipped(found)
    assert "model.safetensors: truncated" in why["checkpoint-20"]
    assert why["checkpoint-30"] == "trainer_state.json does not parse (torn write)"
    assert "lists model-00002-of-00002.safetensors, which is missing" in why["checkpoint-40"]
    assert why["checkpoint-50"].startswith("no model weights")


def test_hf_peft_adapter_counts_as_weights(tmp_path):
    d = hf_checkpoint(tmp_path, 7, weights="none")
    save_file({"lora_A": torch.zeros(4)}, d / "adapter_model.safetensors")
    assert chosen(tmp_path).chosen.name == "checkpoint-7"


def test_deepspeed_tag_newer_than_latest_or_missing_is_not_resumed(tmp_path):
    deepspeed_tag(tmp_path, 10)
    deepspeed_tag(tmp_path, 20)
    (tmp_path / "latest").write_text("global_step20")
    deepspeed_tag(tmp_path, 30)  # written, but `latest` not yet moved to it
    found = chosen(tmp_path)
    assert found.chosen.name == "global_step20" and found.chosen.step == 20 and found.layout == "deepspeed"
    assert "newer than the `latest` tag (global_step20)" in skipped(found)["global_step30"]
    (tmp_path / "latest").write_text("global_step40")
    found = chosen(tmp_path)
    assert skipped(found)["latest"] == "names global_step40, which is not there"


def test_deepspeed_torn_model_states(tmp_path):
    deepspeed_tag(tmp_path, 10)
    truncate(deepspeed_tag(tmp_path, 20) / "mp_rank_00_model_states.pt")
    (tmp_path / "latest").write_text("global_step20")
    found = chosen(tmp_path)
    assert found.chosen.name == "global_step10"
    assert "mp_rank_00_model_states.pt: truncated" in skipped(found)["global_step20"]


def test_lightning_last_and_numbered(tmp_path):
    torch.save(state(), tmp_path / "epoch=0-step=10.ckpt")
    torch.save(state(), tmp_path / "epoch=1-step=20-val_loss=0.50.ckpt")
    truncate(tmp_path / "epoch=1-step=20-val_loss=0.50.ckpt")
    found = chosen(tmp_path)
    assert found.chosen.name == "epoch=0-step=10.ckpt" and found.layout == "lightning"
    torch.save(state(), tmp_path / "last.ckpt")  # written after the numbered ones: the newest
    found = chosen(tmp_path)
    assert found.chosen.name == "last.ckpt" and found.chosen.step is None


def test_lightning_last_ckpt_symlink_is_skipped_not_followed(tmp_path):
    torch.save(state(), tmp_path / "epoch=0-step=10.ckpt")
    os.symlink("epoch=0-step=10.ckpt", tmp_path / "last.ckpt")
    found = chosen(tmp_path)
    assert found.chosen.name == "epoch=0-step=10.ckpt"
    assert skipped(found)["last.ckpt"] == "a symbolic link (not followed)"


def test_dcp_without_metadata_is_torn(tmp_path):
    dcp.save({"w": torch.zeros(8)}, checkpoint_id=tmp_path / "step_100")
    dcp.save({"w": torch.zeros(8)}, checkpoint_id=tmp_path / "step_200")
    (tmp_path / "step_200" / ".metadata").unlink()
    (tmp_path / "logs").mkdir()  # a dir of no layout is not a candidate
    found = chosen(tmp_path)
    assert found.chosen.name == "step_100" and found.chosen.step == 100 and found.layout == "dcp"
    assert skipped(found) == {"step_200": "no .metadata (torch.distributed.checkpoint writes it last)"}


def test_spx_layout_still_by_manifest(tmp_path):
    for step in (10, 20):
        stage = tmp_path / cl.tmp_dirname(step, "t")
        stage.mkdir()
        torch.save(state(), stage / "rank0.pt")
        lw.publish(stage, lw.build_manifest(stage, step=step, epoch=0, world_size=1, fmt="torch"))
    (tmp_path / cl.step_dirname(30)).mkdir()
    found = chosen(tmp_path)
    assert found.chosen.step == 20 and found.layout == "spx"
    assert skipped(found)[cl.step_dirname(30)] == "no COMPLETE.json (spx writes it last)"
    assert cl.find_latest(tmp_path) == cl.CheckpointRef(tmp_path / cl.step_dirname(20), 20)


# --- the pattern, hostile entries, caps ----------------------------------------------------------


def test_pattern_match_of_a_known_layout_gets_its_rule(tmp_path):
    hf_checkpoint(tmp_path, 40)
    hf_checkpoint(tmp_path, 60, trainer_state=False)  # non-empty: the old rule resumed it
    found = chosen(tmp_path, "checkpoint-*/")
    assert found.chosen.name == "checkpoint-40" and "checkpoint-60" in skipped(found)


def test_pattern_dir_of_no_known_layout(tmp_path):
    good, torn, empty = tmp_path / "save_1", tmp_path / "save_2", tmp_path / "save_3"
    for d in (good, torn, empty):
        d.mkdir()
    torch.save(state(), good / "model.pt")
    torch.save(state(), torn / "model.pt")
    truncate(torn / "model.pt")
    found = chosen(tmp_path, "save_*")
    assert found.chosen.name == "save_1" and found.layout == "pattern-dir"
    assert skipped(found)["save_3"] == "empty directory" and "truncated" in skipped(found)["save_2"]


def test_symlinks_and_fifos_are_skipped_never_opened(tmp_path):
    torch.save(state(), tmp_path / "checkpoint_epoch0_step1.pt")
    os.mkfifo(tmp_path / "checkpoint_epoch9_step9.pt")
    os.symlink("/etc", tmp_path / "checkpoint-99")
    os.symlink(tmp_path / "checkpoint_epoch0_step1.pt", tmp_path / "checkpoint_epoch5_step5.pt")
    found = chosen(tmp_path)  # a FIFO opened for reading would block here forever
    assert found.chosen.name == "checkpoint_epoch0_step1.pt"
    why = skipped(found)
    assert why["checkpoint_epoch9_step9.pt"].startswith("not a regular file or directory")
    assert why["checkpoint-99"] == why["checkpoint_epoch5_step5.pt"] == "a symbolic link (not followed)"


def test_a_fifo_inside_a_candidate_is_a_reason_not_a_hang(tmp_path):
    d = hf_checkpoint(tmp_path, 5, trainer_state=False)
    os.mkfifo(d / "trainer_state.json")
    found = chosen(tmp_path)
    assert found.chosen is None and skipped(found)["checkpoint-5"] == "trainer_state.json: not a regular file"


def test_a_huge_dir_is_capped_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(cd, "MAX_SCAN", 300)
    monkeypatch.setattr(cd, "MAX_EVALUATED", 50)
    for i in range(400):
        (tmp_path / f"checkpoint-{i}").mkdir()  # all torn
    found = chosen(tmp_path)
    doc = found.to_json()
    assert found.chosen is None and "stopped after 300 entries" in doc["capped"]
    assert len(doc["skipped"]) == cd.MAX_REPORTED_SKIPS and doc["skipped_more"] == 50 - cd.MAX_REPORTED_SKIPS
    assert len(json.dumps(doc)) < 16_000


def test_hidden_and_staging_entries_are_ignored(tmp_path):
    hf_checkpoint(tmp_path, 10)
    (tmp_path / ".before-job-3").mkdir()
    torch.save(state(), tmp_path / ".before-job-3" / "ckpt.pt")
    (tmp_path / "tmp-checkpoint-20").mkdir()
    found = chosen(tmp_path)
    assert found.chosen.name == "checkpoint-10" and found.skipped == [] and found.layouts == ["hf-trainer"]


# --- exclude and the crash-loop fallback rule ---------------------------------------------------


def test_exclude_passes_over_the_newest_only_while_it_is_the_newest(tmp_path):
    for s in (10, 20):
        torch.save(state(), tmp_path / f"checkpoint_epoch0_step{s}.pt")
    newest = str(tmp_path / "checkpoint_epoch0_step20.pt")
    found = cd.discover(tmp_path, exclude={newest: "crash loop"})
    assert found.chosen.step == 10 and found.excluded.step == 20
    torch.save(state(), tmp_path / "checkpoint_epoch0_step30.pt")  # superseded: nothing to pass over
    found = cd.discover(tmp_path, exclude={newest: "crash loop"})
    assert found.chosen.step == 30 and found.excluded is None and [c.step for c in found.older] == [20, 10]


def test_exclude_never_leaves_nothing_to_resume(tmp_path):
    torch.save(state(), tmp_path / "checkpoint_epoch0_step20.pt")
    truncate_me = tmp_path / "checkpoint_epoch0_step10.pt"
    torch.save(state(), truncate_me)
    truncate(truncate_me)
    only = str(tmp_path / "checkpoint_epoch0_step20.pt")
    found = cd.discover(tmp_path, exclude={only: "crash loop"})
    assert found.chosen.step == 20 and found.excluded is None
    assert [c.step for c in found.skipped] == [10]


def test_before_step_chooses_the_newest_complete_checkpoint_before_a_divergence(tmp_path):
    for s in (10, 20, 30, 40):
        torch.save(state(), tmp_path / f"checkpoint_epoch0_step{s}.pt")
    found = cd.discover(tmp_path, before_step=37)
    assert found.chosen.step == 30 and [c.step for c in found.skipped] == [40]
    assert found.skipped[0].problem == "at or after step 37, where training diverged"
    assert cd.discover(tmp_path, before_step=30).chosen.step == 20  # a checkpoint of the divergent step is after it


def test_before_step_starts_from_scratch_when_nothing_precedes_the_divergence(tmp_path):
    torch.save(state(), tmp_path / "checkpoint_epoch0_step10.pt")
    found = cd.discover(tmp_path, before_step=5)
    assert found.chosen is None and [c.step for c in found.skipped] == [10]


def attempt(number, resumed_from, reason_class="user-code", max_step=None, fallback_from=None):
    doc = {"fallback_from": fallback_from} if fallback_from else {"layout": "epoch-step"}
    return SimpleNamespace(number=number, end=100.0 + number, reason_class=reason_class, resumed_from=resumed_from,
                           resumed_from_step=20 if resumed_from else None, max_step=max_step,
                           checkpoint_discovery=json.dumps(doc))


def test_fallback_after_two_failures_on_the_same_checkpoint():
    avoid = rf.checkpoint_to_avoid([rf.past_attempt(a) for a in (attempt(1, None), attempt(2, "/c/20"),
                                                                  attempt(3, "/c/20"))])
    assert avoid == rf.Avoid("/c/20", "crash loop: attempts 2 and 3 resumed from it and failed")


@pytest.mark.parametrize("history", [
    [attempt(1, "/c/20")],                                                   # one failure is not a loop
    [attempt(1, "/c/10"), attempt(2, "/c/20")],                              # different checkpoints
    [attempt(1, "/c/20"), attempt(2, "/c/20", reason_class="cancelled")],   # not the checkpoint's fault
    [attempt(1, "/c/20"), attempt(2, "/c/20", reason_class=None)],          # succeeded
    [attempt(1, "/c/20"), attempt(2, "/c/20", max_step=25)],                # it loaded and trained past 20
    [attempt(1, None), attempt(2, None)],                                    # fresh starts
    [attempt(1, "/c/30", fallback_from="/c/40"), attempt(2, "/c/30"), attempt(3, "/c/30")],  # once per job
])
def test_no_fallback(history):
    assert rf.checkpoint_to_avoid([rf.past_attempt(a) for a in history]) is None


def test_fell_back_reads_discoverys_answer(tmp_path):
    for s in (10, 20):
        torch.save(state(), tmp_path / f"checkpoint_epoch0_step{s}.pt")
    avoid = rf.Avoid(str(tmp_path / "checkpoint_epoch0_step20.pt"), "crash loop")
    doc = cd.discover(tmp_path, exclude={avoid.path: avoid.why}).to_json()
    assert rf.fell_back(avoid, doc) and not rf.fell_back(avoid, cd.discover(tmp_path).to_json())
    lines = cd.describe({**doc, "fallback_from": avoid.path, "fallback_why": avoid.why})
    assert lines[0].startswith(f"resumed from {tmp_path / 'checkpoint_epoch0_step10.pt'} (step 10), layout epoch-step")
    assert lines[1] == f"fell back from {avoid.path}: crash loop"
