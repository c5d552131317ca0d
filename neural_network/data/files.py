"""Safe files: atomic writes, .npz arrays without pickle, JSON metadata checked before arrays are trusted.

Every file the project writes is a .npz whose entry "meta" is a JSON text stored as UTF-8 bytes (a uint8 array,
which needs no pickle; 0-d unicode arrays written by earlier versions are read too). A writer produces the whole
file under a temporary name in the same folder and renames it over the target, so a crash or Cancel leaves either
the old file or the new one, never half of one.
"""

import json
import os
import tempfile
import zipfile

import numpy as np

# Files get the permissions the user's umask gives a new file (mkstemp alone would make them private, 0600).
_UMASK = os.umask(0)
os.umask(_UMASK)
MAX_NPZ_BYTES = 8 * 1024 ** 3     # more than any dataset or model this add-on writes; a larger file is refused unread


class FileRefused(ValueError):
    """A file that cannot be used, with a message meant for the user."""


def atomic_write_bytes(path, write):
    """Call write(file_object) on a temporary file beside path, then rename it over path."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise FileRefused(f"{path} is a folder, not a file")
    if not os.path.isdir(folder):
        raise FileRefused(f"folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path)[-16:], dir=folder)
    except OSError as exc:     # say which file could not be written, not the temporary name
        raise FileRefused(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_npz(path, arrays, meta):
    """Write arrays and a JSON-able meta dict to path atomically."""
    payload = {name: np.asarray(value) for name, value in arrays.items()}
    for name, value in payload.items():
        if value.dtype == object:
            raise TypeError(f"array {name} has dtype object, which would need pickle")
    payload["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    atomic_write_bytes(path, lambda handle: _write_npz(handle, payload))


def _write_npz(handle, payload):
    """What np.savez writes, with the archive closed even when a write fails (a full disk): np.savez leaves it to
    the garbage collector, whose late close then prints an "Exception ignored" traceback in Blender's console."""
    with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in payload.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)


def check_readable_file(path):
    """Refuse, in plain words, a path that is missing, a folder, or an empty file."""
    if not os.path.exists(path):
        raise FileRefused(f"{path} does not exist")
    if os.path.isdir(path):
        raise FileRefused(f"{path} is a folder, not a file")
    if os.path.getsize(path) == 0:
        raise FileRefused(f"{path} is empty (0 bytes)")


def load_npz(path, kind, required=()):
    """Open an .npz written by save_npz: (meta dict, {name: array}). Raises FileRefused with a plain reason."""
    path = os.fspath(path)
    check_readable_file(path)
    try:
        with zipfile.ZipFile(path) as archive:   # sizes first: a small compressed file may claim gigabytes
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise FileRefused(f"{os.path.basename(path)} is not a readable .npz file (truncated or corrupt): {exc}") from None
    if unpacked > MAX_NPZ_BYTES:
        raise FileRefused(f"{os.path.basename(path)} would unpack to {unpacked / 1024 ** 3:.1f} GB, more than a Neural IK "
                          f"file can hold ({MAX_NPZ_BYTES / 1024 ** 3:.0f} GB)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise FileRefused(f"{os.path.basename(path)} is not a readable .npz file (truncated or corrupt): {exc}") from None
    if "meta" not in arrays:
        raise FileRefused(f"{os.path.basename(path)} has no Neural IK metadata")
    try:
        meta = decode_meta(arrays.pop("meta"))
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as exc:
        raise FileRefused(f"{os.path.basename(path)} has unreadable metadata: {exc}") from None
    if not isinstance(meta, dict) or meta.get("kind") != kind:
        found = meta.get("kind") if isinstance(meta, dict) else type(meta).__name__
        raise FileRefused(f"{os.path.basename(path)} is a {found!r} file, expected {kind!r}")
    missing = [name for name in required if name not in arrays]
    if missing:
        raise FileRefused(f"{os.path.basename(path)} lacks the arrays {', '.join(missing)}")
    return meta, arrays


def decode_meta(entry):
    """The metadata dict from an .npz "meta" entry: UTF-8 bytes, or the 0-d unicode array of earlier versions."""
    if entry.dtype == np.uint8:
        return json.loads(entry.tobytes().decode("utf-8"))
    return json.loads(str(entry))


def save_json(path, data):
    text = json.dumps(data, indent=2)
    atomic_write_bytes(path, lambda handle: handle.write(text.encode()))
