"""MPEG-TS, just enough of it: the video frames of one HLS segment, with their presentation
times.

Why it exists: a live HLS player (:mod:`lab.agents.hlsview`) needs each segment's real
presentation times. The playlist gives a segment only a duration (``EXTINF``), not where its
frames sit on the stream's clock, nor how many frames it holds or which are key frames; the
segment itself does. So every segment fetched is parsed, and this is a compact parser of just
what that needs (ISO/IEC 13818-1): the PAT, the PMT of the first programme, and the PES
headers of its first video and audio PIDs, which give every video frame's PTS, size and
random-access flag (:class:`TsFrame`), and the audio PES count and bytes (:class:`TsContent`).
Nothing else: no PCR, no continuity counters, no elementary-stream parsing.

This runs inside hosts: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: MPEG-TS: packet size, sync byte, PTS clock (Hz), and the PMT stream types we know.
TS_PACKET = 188
TS_SYNC = 0x47
PTS_HZ = 90_000
VIDEO_TYPES = {0x1B: "h264", 0x24: "hevc", 0x02: "mpeg2"}
AUDIO_TYPES = {0x0F: "aac", 0x03: "mp3", 0x04: "mp3", 0x81: "ac3"}


@dataclass
class TsFrame:
    """One video PES (one frame, as nginx-rtmp and ffmpeg write them): PTS (s), random
    access flag, payload bytes."""

    pts: float
    key: bool
    size: int


@dataclass
class TsContent:
    """The video frames, audio PES count and bytes, and what went wrong, of one segment."""

    frames: list[TsFrame] = field(default_factory=list)
    audio_packets: int = 0
    audio_bytes: int = 0
    audio_first_pts: float | None = None
    video_codec: str | None = None
    errors: list[str] = field(default_factory=list)


def _pes_pts(payload: bytes) -> float | None:
    """The PTS of a PES packet's header (ISO/IEC 13818-1 §2.4.3.7), in seconds."""
    if len(payload) < 14 or payload[:3] != b"\0\0\1" or not payload[7] & 0x80:
        return None
    b = payload[9:14]
    ticks = ((b[0] >> 1) & 7) << 30 | b[1] << 22 | (b[2] >> 1) << 15 | b[3] << 7 | b[4] >> 1
    return ticks / PTS_HZ


def _psi_section(payload: bytes) -> bytes:
    """A PSI section from the payload of the packet that starts it (past the pointer field)."""
    return payload[1 + payload[0]:] if payload else b""


def parse_ts(data: bytes) -> TsContent:
    """The frames of an MPEG-TS segment: PAT → PMT → the first video and audio PIDs; a PES
    starts at each packet with ``payload_unit_start_indicator``; its size is the payload bytes
    up to the next start, less its PES header; a key frame is one whose first packet has the
    adaptation field's ``random_access_indicator`` (nginx-rtmp and ffmpeg set it on IDR
    frames; a segment with none has its first frame counted as key, since both cut segments
    at key frames)."""
    out = TsContent()
    pmt_pid = video_pid = audio_pid = None
    cur: TsFrame | None = None
    audio_open = False
    for off in range(0, len(data) - TS_PACKET + 1, TS_PACKET):
        pkt = data[off:off + TS_PACKET]
        if pkt[0] != TS_SYNC:
            out.errors.append(f"lost TS sync at byte {off}")
            break
        pusi = bool(pkt[1] & 0x40)
        pid = (pkt[1] & 0x1F) << 8 | pkt[2]
        afc = (pkt[3] >> 4) & 3
        start, rai = 4, False
        if afc & 2:
            alen = pkt[4]
            rai = alen > 0 and bool(pkt[5] & 0x40)
            start = 5 + alen
        if not afc & 1 or start >= TS_PACKET:
            continue
        payload = pkt[start:]
        if pid == 0 and pusi:
            sec = _psi_section(payload)
            if len(sec) >= 12:
                pmt_pid = (sec[10] & 0x1F) << 8 | sec[11]  # the first programme's PMT
        elif pid == pmt_pid and pusi and video_pid is None:
            sec = _psi_section(payload)
            if len(sec) < 12:
                continue
            end = min(len(sec), 3 + ((sec[1] & 0x0F) << 8 | sec[2]) - 4)
            j = 12 + ((sec[10] & 0x0F) << 8 | sec[11])
            while j + 5 <= end:
                stype, epid = sec[j], (sec[j + 1] & 0x1F) << 8 | sec[j + 2]
                if stype in VIDEO_TYPES and video_pid is None:
                    video_pid, out.video_codec = epid, VIDEO_TYPES[stype]
                elif stype in AUDIO_TYPES and audio_pid is None:
                    audio_pid = epid
                j += 5 + ((sec[j + 3] & 0x0F) << 8 | sec[j + 4])
        elif pid == video_pid and video_pid is not None:
            if pusi:
                pts = _pes_pts(payload)
                if pts is None:
                    cur = None
                    out.errors.append("a video PES without PTS")
                    continue
                cur = TsFrame(pts, rai, len(payload) - 9 - payload[8])
                out.frames.append(cur)
            elif cur is not None:
                cur.size += len(payload)
        elif pid == audio_pid and audio_pid is not None:
            if pusi:
                audio_open = True
                out.audio_packets += 1
                out.audio_bytes += max(0, len(payload) - 9 - payload[8])
                if out.audio_first_pts is None:
                    out.audio_first_pts = _pes_pts(payload)
            elif audio_open:
                out.audio_bytes += len(payload)
    if out.frames and not any(f.key for f in out.frames):
        out.frames[0].key = True
    if len(data) % TS_PACKET:
        out.errors.append(f"{len(data) % TS_PACKET} bytes after the last whole TS packet")
    return out
