"""The Feishu (Lark) adapter, built on lark-oapi.

Start at :class:`bot.feishu.adapter.FeishuAdapter`: it assembles the outbound
:class:`~bot.feishu.client.FeishuClient` (retries, pacing), the ingress (webhook route or long
connection), event-id de-duplication and the card-update throttle from ``FeishuSettings``.
The bot plugs its handlers in as an :class:`~bot.feishu.events.EventSink`.

    events.py      typed events, EventSink / EventDedup seams, the pure parser
    content.py     each kind of message content read through the SDK's normalizers (pure)
    verifier.py    webhook signature, freshness, token and decryption (pure)
    ingress.py     POST /feishu/events
    longconn.py    the SDK's WebSocket client in its own thread, with a silence watchdog
    liveness.py    the long connection's state and last-frame age (/healthz, /metrics)
    dispatcher.py  parse → de-duplicate → sink, ack first
    dedup.py       SQLite event-id memory
    client.py      outbound API calls, retried and paced
    transport.py   the one pooled HTTP session every Feishu call goes out on
    ratelimit.py   pacing under Feishu's per-chat and app-wide limits
    throttle.py    coalesced in-place card updates
    sdk.py         the one import of lark-oapi (and of its message normalizers)
"""
