"""The Feishu (Lark) adapter: outbound client, webhook and long-connection ingress, dedup, throttle.

Seams for the composition root: :class:`~bot.feishu.events.EventSink` receives parsed events,
:class:`~bot.feishu.events.EventDedup` remembers event ids, and
:class:`~bot.feishu.client.FeishuClient` sends and updates messages.
"""
