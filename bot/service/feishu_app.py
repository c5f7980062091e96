"""The Feishu bot inside `amux serve`: the adapter, wired to the Hub's identity and Agent turns."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from bot.comments import COMMENTS_FILE, CommentTurns, DocumentComments
from bot.config import FeishuSettings
from bot.conversations import Conversations
from bot.diffs import DIFFS_DIR, BranchDiffs
from bot.feishu.adapter import FeishuAdapter
from bot.feishu.client import FeishuClient
from bot.feishu.events import CardAction, CardResponse, CommentEvent, MessageEvent, OtherEvent
from bot.feishu.liveness import LINK_HEALTH
from bot.feishu_accounts import App, FeishuAccounts
from bot.feishu_docs import FeishuDocs
from bot.files import TurnFiles
from bot.forwards import ForwardReader
from bot.identity import FeishuIdentities
from bot.linked_docs import LinkedDocs
from bot.management import Management
from bot.names import DisplayNames
from bot.outbox import OUTBOX_FILE, Outbox
from bot.quotas import SenderLimit
from bot.schedule_commands import ScheduleCommands
from bot.scheduler import Scheduler
from bot.sink import BotSink
from bot.topic_commands import TopicCommands
from bot.topic_context import TOPICS_FILE, SeenTopics, TopicReader
from bot.triggers import TriggerDoor
from cards.catalogue import plain_text
from hub.config import HubSettings
from hub.errors import AmuxError
from hub.metrics import METRICS, Metrics
from hub.rpc import HUB
from hub.server import HEALTH, READINESS
from hub.services import Hub
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch import LaunchSite

logger = logging.getLogger("amux.serve")

# The running adapter, for whatever needs Feishu beside the bot (and for tests to wait on it).
FEISHU = web.AppKey("feishu_adapter", FeishuAdapter)
OUTBOX_GRACE_SECONDS = 10.0


class _DeferredSink:
    """Stands in for the bot until the Hub it needs is open; no event arrives before that."""

    def __init__(self) -> None:
        self.target: BotSink | None = None

    def _bot(self) -> BotSink:
        assert self.target is not None, "Feishu events arrived before start-up finished"
        return self.target

    async def on_message(self, event: MessageEvent) -> None:
        await self._bot().on_message(event)

    async def on_card_action(self, action: CardAction) -> CardResponse | None:
        return await self._bot().on_card_action(action)

    async def on_comment(self, event: CommentEvent) -> None:
        await self._bot().on_comment(event)

    async def on_event(self, event: OtherEvent) -> None:
        await self._bot().on_event(event)


def add_feishu(
    app: web.Application,
    hub_settings: HubSettings,
    settings: FeishuSettings,
    client: FeishuClient | None,
    *,
    runtime: RuntimeSettings | None = None,
    owner_open_id: str = "",
) -> None:
    """The bot on ``app``; ``runtime`` is the in-process worker's settings, when there is one;
    ``owner_open_id`` the person who made the app, who becomes the owner if there is none yet."""
    sink = _DeferredSink()
    adapter = _mount_adapter(app, hub_settings, settings, client, sink)
    # Served from the start, answering "starting" until the scheduler it hands requests to runs.
    triggers = TriggerDoor()
    app.add_routes(triggers.routes())
    metrics = app.get(METRICS)
    _observe(app, adapter, settings, metrics)

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        bot = _assemble(app[HUB], adapter, hub_settings, settings, runtime, metrics, owner_open_id)
        sink.target = bot.sink
        await bot.start()
        triggers.scheduler = bot.scheduler
        yield
        triggers.scheduler = None
        await bot.stop()

    app.cleanup_ctx.append(lifetime)


def _mount_adapter(
    app: web.Application,
    hub_settings: HubSettings,
    settings: FeishuSettings,
    client: FeishuClient | None,
    sink: _DeferredSink,
) -> FeishuAdapter:
    """The Feishu adapter, its routes on ``app``."""
    adapter = FeishuAdapter(
        settings,
        sink,
        state_dir=hub_settings.home,
        client=client,
        body_seconds=hub_settings.request_body_seconds,
    )
    app[FEISHU] = adapter
    app.add_routes(adapter.routes())
    return adapter


def _observe(
    app: web.Application,
    adapter: FeishuAdapter,
    settings: FeishuSettings,
    metrics: Metrics | None,
) -> None:
    """The bot in the app's metrics, readiness and health."""
    if metrics is not None:
        adapter.client.observer = metrics
        adapter.dispatcher.observer = metrics

    async def feishu_ready() -> tuple[bool, str]:
        # Knowing the bot's own identity proves the credentials and the API are reachable.
        if adapter.identity_known.is_set():
            return True, f"connected ({settings.mode})"
        return False, "the bot's identity is not known yet: check the app id, secret and domain"

    app[READINESS].add("feishu", feishu_ready)
    link = adapter.link_health
    if link is not None:
        app[HEALTH].add(LINK_HEALTH, lambda: link.snapshot().to_json())
        if metrics is not None:
            metrics.set_feishu_link_source(link.snapshot)


@dataclasses.dataclass
class _Bot:
    """The bot's parts that live as long as the app: started in this order, stopped in its own."""

    adapter: FeishuAdapter
    names: DisplayNames
    identities: FeishuIdentities
    management: Management
    seen: SeenTopics
    outbox: Outbox
    conversations: Conversations
    sink: BotSink
    scheduler: Scheduler
    accounts: FeishuAccounts
    comments: DocumentComments
    comment_turns: CommentTurns

    async def start(self) -> None:
        self.identities.offer_claim()
        await self.adapter.start()
        self.outbox.start()
        self.conversations.resume()
        self.comments.resume()
        self.scheduler.start()
        pending = self.management.pending_restart_card()
        if pending is not None:
            message_id, card = pending
            try:
                await self.adapter.client.update_card(message_id, card)
            except AmuxError as error:
                logger.warning("could not refresh the restart card: %s", error.message)

    async def stop(self) -> None:
        await self.scheduler.stop()
        # Turns that finished during the drain have their answers owed by now; give them a
        # moment to go out. What Feishu does not take in time stays owed for the next process.
        await self.conversations.stop()
        await self.comments.stop()
        await self.adapter.dispatcher.drain()
        await self.names.close()
        await self.accounts.close()
        await self.outbox.stop(OUTBOX_GRACE_SECONDS)
        await self.adapter.stop()
        self.outbox.close()
        self.seen.close()
        self.comment_turns.close()


def _assemble(
    hub: Hub,
    adapter: FeishuAdapter,
    hub_settings: HubSettings,
    settings: FeishuSettings,
    runtime: RuntimeSettings | None,
    metrics: Metrics | None,
    owner_open_id: str,
) -> _Bot:
    """The bot's parts, on the open Hub: who is who, management, the outbox, conversations."""
    client = adapter.client
    names = DisplayNames(hub.people, client)
    identities = FeishuIdentities(
        hub.people,
        enroll=settings.enroll == "auto",
        app_id=settings.app_id,
        tenant_key=settings.tenant_key,
        names=names,
        scanner_open_id=owner_open_id,
    )
    accounts = FeishuAccounts(
        hub.user_tokens,
        App(settings.app_id, settings.app_secret.get_secret_value(), settings.domain),
        settings.language,
        http=client.http,
    )
    management = Management(
        hub,
        settings.language,
        settings.provider,
        tell=client.send_text,
        zone=settings.time_zone,
        accounts=accounts,
    )
    seen = SeenTopics(hub_settings.home / TOPICS_FILE)
    files = _turn_files(client, hub_settings, runtime)
    # Project turns' diffs, and the workspace's outbox files when the worker is ours.
    diffs = BranchDiffs(
        hub_settings.home / DIFFS_DIR, client, files.post if files is not None else None
    )
    outbox = _outbox(adapter, hub_settings, settings, diffs, metrics)
    documents = LinkedDocs(
        accounts.access_token,
        settings.domain,
        settings.language,
        link_bytes=settings.document_link_bytes,
        turn_bytes=settings.document_turn_bytes,
        http=client.http,
    )
    # The Agent's Feishu tools read through the Hub as the person a turn is for.
    hub.feishu_docs = FeishuDocs(accounts.access_token, settings.domain, http=client.http)
    conversations = Conversations(
        hub,
        client,
        adapter.cards.update,
        outbox,
        provider_of=management.provider_of,
        lang=settings.language,
        stream_interval=settings.card_update_interval_seconds,
        topics=TopicReader(client),
        seen=seen,
        files=files,
        diffs=diffs,
        zone=settings.time_zone,
        forwards=ForwardReader(client),
        documents=documents,
    )
    scheduler = Scheduler(
        hub, client, conversations, lang=settings.language, zone=settings.time_zone
    )
    schedule_commands = ScheduleCommands(
        hub.schedules,
        client,
        settings.language,
        settings.time_zone,
        provider_of=management.provider_of,
        wake=scheduler.wake,
    )
    comment_turns = CommentTurns(hub_settings.home / COMMENTS_FILE)
    comments = DocumentComments(
        hub,
        client,
        lang=settings.language,
        bot_open_id=lambda: adapter.dispatcher.bot_open_id,
        provider_of=management.provider_of,
        reach=conversations.private_chat_of,
        turns=comment_turns,
        documents=documents,
        zone=settings.time_zone,
    )
    limit = SenderLimit(hub.config.messages_per_minute)
    sink = BotSink(
        client,
        identities,
        management,
        conversations,
        settings.language,
        limit,
        schedule_commands,
        late=adapter.catch_up,
        accounts=accounts,
        comments=comments,
        topics=TopicCommands(client, hub, conversations, settings.models, settings.language),
    )
    return _Bot(
        adapter,
        names,
        identities,
        management,
        seen,
        outbox,
        conversations,
        sink,
        scheduler,
        accounts,
        comments,
        comment_turns,
    )


def _turn_files(
    client: FeishuClient, hub_settings: HubSettings, runtime: RuntimeSettings | None
) -> TurnFiles | None:
    """The workspace's files a turn posts, when the worker is in this process (None else)."""
    if runtime is None:
        return None
    work_dir = runtime.work_dir_beside(hub_settings.home)
    return TurnFiles(client, LaunchSite(runtime, work_dir, hub_settings.home))


def _outbox(
    adapter: FeishuAdapter,
    hub_settings: HubSettings,
    settings: FeishuSettings,
    diffs: BranchDiffs,
    metrics: Metrics | None,
) -> Outbox:
    """What the bot owes Feishu, kept until Feishu takes it."""
    client, lang = adapter.client, settings.language
    return Outbox(
        hub_settings.home / OUTBOX_FILE,
        adapter.cards.finish,
        lambda reply_to, card, key: client.reply(reply_to, card=card, idempotency_key=key),
        client.finish_card_entity,
        post_file=diffs.post,
        dropped=metrics.feishu_gave_up if metrics is not None else lambda reason: None,
        reply_text=lambda reply_to, text, key: client.reply(
            reply_to, text=text, idempotency_key=key
        ),
        refused_notice=lambda reason: plain_text(lang, "outbox.refused"),
    )
