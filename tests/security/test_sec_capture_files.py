"""Captured requests and answers on disk, readable by other users (issue 56, finding 6c).

Data-capture records and the folders made for them were created under the umask (0644 / 0755 under
the usual 022), so any user of the machine could read callers' requests and answers. Now files are
0600 and the folders the gateway makes 0700, whatever the umask. Unit-level: a real CaptureWriter
writing to a real folder.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from serving.config.data_capture import DataCaptureConfig
from serving.gateway.after_answer import AfterAnswer
from serving.gateway.capture import CaptureWriter


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_capture_files_are_0600_and_the_folders_made_for_them_0700_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    destination = tmp_path / "capture"  # missing: the writer makes it, with everything under it
    config = DataCaptureConfig.model_validate(
        {
            "InitialSamplingPercentage": 100,
            "DestinationS3Uri": str(destination),
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        }
    )

    async def capture() -> None:
        writer = CaptureWriter(AfterAnswer())
        writer.offer(
            config,
            "private",
            "AllTraffic",
            b"[[1, 2]]",
            {"content-type": "application/json"},
            b"[1]",
            "application/json",
        )
        await writer.after.close()  # what the gateway's lifespan does

    previous = os.umask(umask)
    try:
        asyncio.run(capture())
    finally:
        os.umask(previous)
    files = [p for p in destination.rglob("*") if p.is_file()]
    folders = [destination, *(p for p in destination.rglob("*") if p.is_dir())]
    assert len(files) == 1 and len(folders) == 7  # capture/endpoint/variant/yyyy/mm/dd/hh
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o600"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {"0o700"}
