"""Pure builders of Feishu card JSON 2.0 (no I/O, imports nothing else of amux).

Every builder takes a small frozen view-model from :mod:`cards.models` and a language
(``"zh_cn"`` or ``"en_us"``) and returns a plain ``dict`` ready to be JSON-encoded. Interactive
elements carry callback values from the vocabulary in :mod:`cards.actions`.
"""
