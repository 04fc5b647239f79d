"""Python packages a team uploads for its jobs' `requirements` (`upload:<sha256>`, issue 19).

The bytes are content-addressed in the artifact store (`<store>/packages/<sha256>`, a local folder
or s3://), written once whoever uploads them; a `Package` row makes a file its team's, so a team
sees (and its nodes download) only what it uploaded. The file is written before its row: a crash in
between leaves an unreferenced file (harmless, reused by the next upload of the same bytes), never a
row without its file."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane.jobs.artifacts import artifact_store, store_folder
from controlplane.jobs.models import Package
from controlplane.tunables import tunable
from runtime.config import PACKAGE_SUFFIXES, UPLOAD_PREFIX

# pip reads a wheel's name, version and tags from its file name, so the name is kept; only plain
# characters, so it is safe as a file name on a node and in a Content-Disposition header.
PACKAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
_CHUNK = 1 << 20


def packages_location() -> str:
    """The packages' folder of the artifact store."""
    return f"{artifact_store().rstrip('/')}/packages"


def package_max_bytes() -> int:
    return int(tunable("SPOTPIPE_PACKAGE_MAX_BYTES"))


def too_big_message(size: int) -> str:
    return f"the file is {size:,} bytes; expected at most {package_max_bytes():,}"


def check_request_size(content_length: int) -> None:
    """Refuse a request body far over the limit before it is read (its multipart framing aside)."""
    if content_length > package_max_bytes() + 64 * 1024:
        raise ValidationError({"file": [too_big_message(content_length)]})


def _check_upload(upload: Any) -> None:
    name, size = str(getattr(upload, "name", "") or ""), int(getattr(upload, "size", 0) or 0)
    if not PACKAGE_NAME.fullmatch(name) or not name.endswith(PACKAGE_SUFFIXES) or ".." in name:
        raise ValidationError({"file": [
            f"file name {name[:80]!r} is not a package file; expected a wheel or sdist named like "
            f"mypkg-1.0-py3-none-any.whl (letters, digits, . _ + -, ending {', '.join(PACKAGE_SUFFIXES)})"]})
    if size < 1:
        raise ValidationError({"file": ["the file is empty"]})
    if size > package_max_bytes():
        raise ValidationError({"file": [too_big_message(size)]})


def _digest(upload: Any) -> str:
    digest = hashlib.sha256()
    for chunk in upload.chunks(_CHUNK):
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


def package_store(*, team: Any, user: Any | None, upload: Any) -> tuple[Package, bool]:
    """Store an uploaded package file for `team`; returns (package, created). Uploading the same
    bytes again answers the same package (idempotent); raises ValidationError (`file`) for a name
    that is not a wheel/sdist or a size out of bounds, before anything is written."""
    _check_upload(upload)
    sha256 = _digest(upload)
    existing = Package.objects.filter(team=team, sha256=sha256).first()
    if existing is not None:
        return existing, False
    folder = store_folder(packages_location())
    stored = folder.stat(sha256)
    if stored is None or stored[0] != upload.size:
        folder.write_stream(sha256, upload)
    try:
        with transaction.atomic():
            package = Package.objects.create(team=team, created_by=user, sha256=sha256, filename=upload.name,
                                             size=upload.size)
    except IntegrityError:  # the same upload raced this one: theirs is the team's package
        return Package.objects.get(team=team, sha256=sha256), False
    return package, True


def package_open(*, package: Package) -> Any:
    """An open binary stream of the package's file (a file, or the S3 object's body)."""
    return store_folder(packages_location()).open(package.sha256)


def unknown_uploads(*, team: Any, requirements: list[str]) -> dict[int, str]:
    """The `upload:<sha256>` entries of `requirements` the team has no package for: index -> sha256."""
    wanted = {i: r.removeprefix(UPLOAD_PREFIX) for i, r in enumerate(requirements) if r.startswith(UPLOAD_PREFIX)}
    if not wanted:
        return {}
    known = set(Package.objects.filter(team=team, sha256__in=set(wanted.values())).values_list("sha256", flat=True))
    return {i: sha for i, sha in wanted.items() if sha not in known}


def package_summary(package: Package) -> dict[str, Any]:
    """The API's answer for a stored package: what to put in `config.requirements`."""
    return {"sha256": package.sha256, "requirement": f"{UPLOAD_PREFIX}{package.sha256}", "size": package.size,
            "filename": package.filename}
