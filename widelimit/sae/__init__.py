"""Trained SAEs: the SAE object and its one encoder (:mod:`.model`), files and library objects (:mod:`.formats`),
certification (:mod:`.certify`), the certified objective (:mod:`.objective`), metrics (:mod:`.metrics`), the report
(:mod:`.report`), the training callback (:mod:`.callback`), and the downstream loss with the SAE spliced in (:mod:`.downstream`)."""

from .callback import CertifyCallback

__all__ = ["CertifyCallback"]
