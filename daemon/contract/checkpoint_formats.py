"""Completeness rules for the checkpoint formats people write, read without torch.

Each function takes one candidate (a file or a directory in the user's checkpoint dir) and returns
None when it is complete, or one short reason why it is not ("no trainer_state.json (the Trainer
writes it last)"). The rule is the writer's own last act: the zip central directory torch.save
writes at the end, the `.metadata` torch.distributed.checkpoint writes after every rank's shards,
the `trainer_state.json` the Hugging Face Trainer writes after the weights, the `latest` tag file
DeepSpeed writes after the tag directory. Truncated safetensors are caught by their header, which
states the byte length of the data that must follow it.

Run as the job's owner (userfs.user_actions), never as root; even so, links are not followed and
nothing but regular files is opened (O_NOFOLLOW | O_NONBLOCK, then fstat), so a FIFO or a link
farm in the dir is a reason, not a hang. stdlib (and core.bounded) only.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
from pathlib import Path

from spx.daemon.contract.checkpoint_layout import MANIFEST, read_manifest
from spx.daemon.core import bounded

MAX_JSON_BYTES = 32 << 20        # trainer_state.json with a long log_history, a shard index
MAX_SAFETENSORS_HEADER = 100 << 20
MAX_DIR_ENTRIES = 4096           # entries of one candidate directory looked at
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
PARTIAL_SUFFIXES = (".tmp", ".part", ".partial", ".incomplete")

# Weights a Trainer checkpoint may hold, in the order transformers prefers them.
HF_SINGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
HF_TORCH_EXTRAS = ("optimizer.pt", "scheduler.pt")


class NotRegular(Exception):
    """The path is missing, a link, a FIFO, a directory … anything but a regular file."""


def _open_regular(path: Path) -> int:
    """An fd on `path` if it is a regular file (never a link followed, never a FIFO waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotRegular("missing") from None
    except OSError as e:
        raise NotRegular("a symbolic link" if os.path.islink(path) else e.strerror or "unreadable") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular("not a regular file")
    return fd


def kind(path: Path) -> str | None:
    """"dir", "file", or None for anything else (a link, a FIFO, a socket, gone)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else None


def not_followed(path: Path) -> str:
    """The reason a candidate that is neither a plain file nor a plain directory is skipped."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "vanished while it was read"
    if stat.S_ISLNK(mode):
        return "a symbolic link (not followed)"
    return "not a regular file or directory (a FIFO, socket or device is never opened)"


def read_json(path: Path, cap: int = MAX_JSON_BYTES) -> object:
    """The JSON in regular file `path` (at most `cap` bytes); NotRegular or ValueError (a
    `bounded.Garbage`: too deep to parse, not JSON). Numbers out of range (a NaN loss in a log
    history, total_flos past 2**53) are kept as `bounded.Unusable`: only the shape is judged here."""
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as f:
        raw = f.read(cap + 1)
    return bounded.parse_json(raw, path.name, max_bytes=cap, mark=True)


def torch_zip_problem(path: Path, *, pickle: bool = True) -> str | None:
    """torch.save's zip format: the central directory (written last) reads, and the pickle it
    always writes (`<archive>/data.pkl`) is listed (`pickle=False`: any zip, for a pattern match
    of a format no layout names). A torn write has no central directory."""
    try:
        fd = _open_regular(path)
    except NotRegular as e:
        return f"{path.name}: {e}"
    try:
        with os.fdopen(fd, "rb") as f, zipfile.ZipFile(f) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return f"{path.name}: truncated or not a torch.save file (no zip central directory)"
    if pickle and not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return f"{path.name}: a zip without data.pkl (not a torch.save file)"
    return None


def safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header naming each tensor's byte
    range, then the data: complete when the file is exactly as long as the header says."""
    try:
        fd = _open_regular(path)
    except NotRegular as e:
        return f"{path.name}: {e}"
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            return f"{path.name}: truncated (no header)"
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_SAFETENSORS_HEADER, size - 8):
            return f"{path.name}: truncated (header of {n} bytes in a file of {size})"
        try:
            header = bounded.parse_json(f.read(n), path.name, max_bytes=MAX_SAFETENSORS_HEADER, mark=True)
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return f"{path.name}: its header does not parse (torn write)"
    if size != 8 + n + end:
        return f"{path.name}: truncated ({size} bytes, its header says {8 + n + end})"
    return None


def weights_file_problem(path: Path) -> str | None:
    """safetensors by its header, anything else as torch.save's zip."""
    return safetensors_problem(path) if path.name.endswith(".safetensors") else torch_zip_problem(path)


def names_in(path: Path, cap: int = MAX_DIR_ENTRIES) -> list[str]:
    """Up to `cap` entry names of directory `path` (not followed if a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        names = []
        with os.scandir(fd) as it:
            for entry in it:
                names.append(entry.name)
                if len(names) >= cap:
                    break
        return names
    finally:
        os.close(fd)


# --- per-layout rules ----------------------------------------------------------------------------


def spx_problem(path: Path) -> str | None:
    """spx's own `step-*/`: the manifest (written last) parses and lists files of the sizes it says."""
    if kind(path / MANIFEST) != "file":
        return f"no {MANIFEST} (spx writes it last)"
    return None if read_manifest(path) is not None else f"{MANIFEST} does not match the files (torn or altered)"


def hf_weights_problem(path: Path, names: set[str]) -> str | None:
    """The model weights of a Trainer checkpoint: one file, a sharded index whose every shard is
    there and whole, PEFT adapters, DeepSpeed's own tree, or FSDP's DCP dirs."""
    for name in HF_SINGLE_WEIGHTS:
        if name in names:
            return weights_file_problem(path / name)
    for name in HF_INDEXES:
        if name in names:
            try:
                index = read_json(path / name)
                shards = sorted(set(index["weight_map"].values()))  # type: ignore[index]
            except (NotRegular, ValueError, KeyError, TypeError, AttributeError):
                return f"{name} does not parse (torn write)"
            for shard in shards:
                if not isinstance(shard, str) or "/" in shard or shard.startswith("."):
                    return f"{name} names an odd shard {shard!r}"
                if shard not in names:
                    return f"{name} lists {shard}, which is missing"
                problem = weights_file_problem(path / shard)
                if problem:
                    return problem
            return None
    if "latest" in names:  # a Trainer run under DeepSpeed saves the engine's tree, not the weights
        return deepspeed_dir_problem(path)
    fsdp = sorted(n for n in names if n.startswith("pytorch_model_fsdp"))
    if fsdp:
        return dcp_problem(path / fsdp[0])
    return "no model weights (model.safetensors, pytorch_model.bin, a sharded index or adapter_model.*)"


def hf_trainer_problem(path: Path) -> str | None:
    """Hugging Face Trainer `checkpoint-N/`: `trainer_state.json` (written after the weights and the
    optimizer) parses, and the weights are whole."""
    names = set(names_in(path))
    if "trainer_state.json" not in names:
        return "no trainer_state.json (the Trainer writes it last)"
    try:
        state = read_json(path / "trainer_state.json")
    except NotRegular as e:
        return f"trainer_state.json: {e}"
    except ValueError:
        return "trainer_state.json does not parse (torn write)"
    if not isinstance(state, dict):
        return "trainer_state.json is not a JSON object"
    problem = hf_weights_problem(path, names)
    if problem:
        return problem
    for extra in HF_TORCH_EXTRAS:
        if extra in names and (problem := torch_zip_problem(path / extra)):
            return problem
    return None


def deepspeed_tag_problem(tag_dir: Path) -> str | None:
    """A DeepSpeed tag dir (`global_stepN/`): at least one `*model_states.pt`, and every model and
    optimizer states file whole."""
    names = sorted(names_in(tag_dir))
    states = [n for n in names if n.endswith(("model_states.pt", "optim_states.pt"))]
    if not any(n.endswith("model_states.pt") for n in states):
        return "no *model_states.pt (DeepSpeed's model states)"
    for name in states:
        if problem := torch_zip_problem(tag_dir / name):
            return problem
    return None


def read_latest_tag(base: Path) -> str | None:
    """The tag DeepSpeed's `latest` file names (None if there is none or it is not a plain name)."""
    try:
        fd = _open_regular(base / "latest")
    except NotRegular:
        return None
    with os.fdopen(fd, "rb") as f:
        tag = f.read(4096).decode(errors="replace").strip()
    return tag if tag and "/" not in tag and tag not in (".", "..") else None


def deepspeed_dir_problem(base: Path) -> str | None:
    """A directory holding a DeepSpeed save (`latest` + its tag dir), as nested in a Trainer checkpoint."""
    tag = read_latest_tag(base)
    if tag is None:
        return "no readable `latest` tag file (DeepSpeed writes it last)"
    if kind(base / tag) != "dir":
        return f"`latest` names {tag}, which is not there"
    return deepspeed_tag_problem(base / tag)


def dcp_problem(path: Path) -> str | None:
    """torch.distributed.checkpoint: the coordinator writes `.metadata` after every rank's shards."""
    names = names_in(path)
    if ".metadata" not in names:
        return "no .metadata (torch.distributed.checkpoint writes it last)"
    try:
        fd = _open_regular(path / ".metadata")
    except NotRegular as e:
        return f".metadata: {e}"
    size = os.fstat(fd).st_size
    os.close(fd)
    return None if size > 0 else ".metadata is empty (torn write)"


def looks_like_dcp(path: Path) -> bool:
    """Holds DCP's files? Every rank writes a `*.distcp`, so the first entries tell."""
    return any(n == ".metadata" or n.endswith(".distcp") for n in names_in(path, 64))


def generic_dir_problem(path: Path) -> str | None:
    """A `checkpoints.pattern` match of no known layout: judged by the known layout its content
    shows, else non-empty, no partial files, every torch.save / safetensors file whole."""
    names = names_in(path)
    have = set(names)
    if MANIFEST in have:
        return spx_problem(path)
    if "trainer_state.json" in have or have & {*HF_SINGLE_WEIGHTS, *HF_INDEXES}:
        return hf_trainer_problem(path)
    if "latest" in have:
        return deepspeed_dir_problem(path)
    if ".metadata" in have or any(n.endswith(".distcp") for n in names):
        return dcp_problem(path)
    if not names:
        return "empty directory"
    for name in sorted(names):
        if name.endswith(PARTIAL_SUFFIXES):
            return f"holds a partial file {name}"
        whole = kind(path / name) != "file" or not name.endswith((*TORCH_SUFFIXES, ".safetensors"))
        if not whole and (problem := weights_file_problem(path / name)):
            return problem
    return None


def generic_file_problem(path: Path) -> str | None:
    """A `checkpoints.pattern` file match: whole by its format (torch.save's zip or safetensors)."""
    if path.name.endswith(PARTIAL_SUFFIXES):
        return "a partial file"
    return safetensors_problem(path) if path.name.endswith(".safetensors") else torch_zip_problem(path, pickle=False)
