"""The amux process: the application factory, `amux serve`, logging and the Feishu wiring.

``app.create_app`` composes the Hub, the Feishu bot and the in-process Runtime worker into one
aiohttp application; ``serve`` runs it (drain, restart in place); ``feishu_app`` adds the Feishu
side; ``logs`` and ``heap`` are the process's logging and memory diagnostics.
"""
