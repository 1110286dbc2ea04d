"""Trained SAEs: the SAE object and its one encoder (:mod:`.model`), files and library objects (:mod:`.formats`),
certification (:mod:`.certify`), the certified objective (:mod:`.objective`), metrics (:mod:`.metrics`), the report
(:mod:`.report`), the training callback (:class:`widelimit.sae.callback.CertifyCallback`), and the downstream loss
with the SAE spliced in (:mod:`.downstream`).

Nothing is imported here: ``widelimit.learn`` imports :mod:`.model` (the one encoder) and
:mod:`.certify` imports ``widelimit.learn``, so this package stays empty to keep that one-way.
"""
