"""Capture backends: a batch of token sequences in, per-sample aux + final hidden states out."""

from hs_dataset.capture.base import CaptureBackend, CaptureFailure, CaptureInfo, CaptureResult

__all__ = ["CaptureBackend", "CaptureFailure", "CaptureInfo", "CaptureResult"]
