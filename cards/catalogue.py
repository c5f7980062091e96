"""The message catalogue: every user-visible card string, in zh_cn and en_us.

Both languages carry exactly the same keys and the same ``{placeholders}`` (a test pins this), so
a builder can never fall back silently to the other language.
"""

from __future__ import annotations

import re
from typing import Any

from cards.models import Lang

# What Markdown a catalogue string may carry for a card: bold and inline code.
_MARKUP = re.compile(r"\*\*|`")

MESSAGES: dict[Lang, dict[str, str]] = {
    "en_us": {
        "manage.title": "amux management",
        "manage.identity": "**You are** {name} (`{principal}`, {kind})",
        "manage.kind.user": "user",
        "manage.kind.service": "service",
        "manage.role.owner": "Owner of this Hub",
        "manage.role.member": "Member",
        "manage.scope": "**Memory scope** `{scope}`",
        "manage.scope.global": "Global memory, shared by every authorized Agent",
        "manage.scope.principal": "Your own memory, separate from other members",
        "manage.member_hint": (
            "Only the owner can change Hub settings. You can review your own memory."
        ),
        "manage.experiments": "**Experiments**",
        "manage.memory_switch": "Agent memory",
        "manage.isolation_switch": "User isolation",
        "manage.values": "saved: **{saved}**, running: **{running}**",
        "manage.history": (
            "**History kept**: days an overwritten or forgotten document stays restorable"
        ),
        "manage.restart_pending": "Restart pending: saved values apply at the next Hub restart.",
        "manage.unsaved": "You have unsaved changes.",
        "manage.stale": (
            "**Nothing was saved**: these settings were changed elsewhere after your card was "
            "shown. The card now shows the current values; choose again and save."
        ),
        "manage.save": "Save",
        "manage.my_memory": "My memory",
        "manage.provider": "**Agent in this chat** `{provider}` (new conversations)",
        "manage.restarted": "The Hub restarted; the running values below are now in effect.",
        "manage.fair_share": "**Fair share**: no one person takes the Agents from everyone else",
        "manage.max_queued": (
            "**Waiting turns per person**: more are refused, with when to try again"
        ),
        "manage.messages_per_minute": (
            "**Messages per minute per person**: more start nothing, with when to try again"
        ),
        "value.on": "on",
        "value.off": "off",
        "value.days": "{days} days",
        "value.no_limit": "no limit",
        "restart.title": "Saved: restart to apply",
        "restart.changes": (
            "**Saved** Agent memory: {memory}; user isolation: {isolation}; history kept: {history}"
        ),
        "restart.body": (
            "Saving does not change the running policy. A restart starts no new Agent turns, "
            "gives running ones up to AMUX_DRAIN_SECONDS (2 minutes by default) to finish, "
            "hands back those still running (they run again from the start after the restart, "
            "and their cards keep updating), then the Hub starts again with the saved values.\n"
            "- Agent memory on: new conversations can read and save memory. Existing "
            "conversations without a memory binding do not migrate: start a new conversation "
            "after enabling.\n"
            "- Agent memory off: memory tools are rejected, files are kept. Bound conversations "
            "keep their protocol and fail memory calls until it is enabled again.\n"
            "- User isolation decides whether members share one global memory or each get their "
            "own.\n"
            "- History kept: the days an overwritten or forgotten document stays restorable. "
            "When the Hub starts, kept earlier versions older than that (all of them when off) "
            "are removed.\n"
            "- Fair share: a person's turns past the waiting limit, and messages past the "
            "per-minute limit, are answered with when to try again instead of starting."
        ),
        "restart.when": (
            "Restart at a quiet moment: running Agent turns get up to 2 minutes to finish first."
        ),
        "restart.now": "Restart now",
        "restart.later": "Later",
        "restart.scheduled": (
            "Restarting: no new Agent turns start; running ones finish or are handed back to run "
            "again after the restart. This card shows the new running state when it is back."
        ),
        "restart.deferred": "Not restarted. The saved values stay pending until the next restart.",
        "memory.title": "My memory",
        "memory.scope": "Scope `{scope}`",
        "memory.project": "The memory of project **{project}**, shared by this group's turns.",
        "memory.empty": "No memory documents here yet.",
        "memory.truncated": "More documents exist; narrow the prefix or search.",
        "memory.open": "Open",
        "memory.search_placeholder": "Literal keywords, e.g. review report",
        "memory.search": "Search",
        "memory.search_title": "Search: {query}",
        "memory.no_hits": "Nothing matched. Try other literal keywords or a known path.",
        "memory.incomplete": "The search stopped at its scan budget; results may be incomplete.",
        "memory.search_empty": "type some keywords to search for",
        "memory.gone": "{path} no longer exists",
        "memory.document_title": "{path}",
        "memory.revision": "revision `{revision}`",
        "memory.more": "Read more",
        "memory.forget": "Forget",
        "memory.back": "Back to list",
        "memory.forget_title": "Forget this document?",
        "memory.forget_body": (
            "**{path}** (revision `{revision}`) will be deleted. If it changed since you opened "
            "it, nothing is deleted and you will be asked to look again.\n"
            "Content already read into a conversation stays there; copies in other documents stay "
            "too."
        ),
        "memory.forget_confirm": "Forget",
        "memory.forget_cancel": "Keep it",
        "memory.forgotten_title": "Forgotten",
        "memory.forgotten": "**{path}** was deleted.",
        "memory.private_chat_only": (
            "Your memory is shown only in your private chat with the bot, where a card's changes "
            "are seen by you alone (if this is that chat, send the bot a message here first)."
        ),
        "memory.already_absent": "**{path}** was already gone.",
        "memory.changes": "**Recent changes**",
        "memory.changes_title": "Changes to my memory",
        "memory.no_changes": "No changes recorded.",
        "memory.change": "{when} · {action} {path} · by {by}",
        "memory.change.by_conversation": "conversation `{session}`",
        "memory.change.by_person": "{name} ({via})",
        "memory.change.restorable": "earlier version restorable until {until}",
        "memory.restore": "Restore this version",
        "memory.restored": "**{path}** is back at revision `{revision}`.",
        "memory.restored_title": "Restored",
        "memory.history": "Changes",
        "memory.erase": "Erase…",
        "memory.erase_title": "Erase for good?",
        "memory.erase_body": (
            "This removes **{documents}** document(s) ({what}), **{copies}** kept earlier "
            "version(s), and the path from **{entries}** change-log entries. It cannot be undone."
        ),
        "memory.erase_all": "your whole memory",
        "memory.erase_kept": (
            "Kept **{count}** shared document(s) someone else changed too: {paths}. Erase removes "
            "only what nobody else changed; ask them, or the owner, to remove the rest."
        ),
        "memory.erase_confirm": "Erase",
        "memory.erased_title": "Erased",
        "memory.erased": (
            "Removed {documents} document(s) and {copies} kept earlier version(s); the path was "
            "replaced in {entries} change-log entries."
        ),
        "memory.not_erased": (
            "Transcripts the Agents keep natively are conversation history, not memory: they are "
            "not erased."
        ),
        "progress.title.queued": "Queued",
        "progress.title.running": "Working",
        "progress.title.done": "Done",
        "progress.title.failed": "Failed",
        "progress.title.cancelled": "Cancelled",
        "progress.elapsed": "{seconds} s elapsed",
        "progress.plan": "**Plan** ({done}/{total} done)",
        "progress.steps": "**Steps** ({count})",
        "footer.context": "context {percent}% full",
        "footer.compact": ("The context is {percent}% full: consider `/compact`."),
        "progress.steps.earlier": "… and {more} earlier",
        "step.read": "read",
        "step.edit": "edit",
        "step.run": "run",
        "step.search": "search",
        "step.tool": "tool",
        "step.compact": "compacted the conversation's context",
        "progress.cancel": "Stop",
        "progress.stopped_by": "Stopped by **{name}**.",
        "progress.recalled_by": "Recalled by **{name}**: this request is not answered.",
        "recall.by_sender": "its sender",
        "recall.by_admin": "a chat administrator",
        "progress.restarting": "The Hub is restarting: this card carries on when it is back.",
        "context.unavailable": (
            "The topic's earlier messages could not be read ({reason}): the Agent sees only this "
            "message."
        ),
        "conversation.new": "New conversation",
        "files.refused": "Not read: {items}",
        "outbox.refused": (
            "A message of this turn could not be shown here: Feishu refused it. The conversation "
            "keeps the answer: ask in this topic to see it again, shorter or in parts."
        ),
        "conversation.renewed": "The next message in this topic starts a new conversation.",
        "conversation.not_yours": "Only whoever started this conversation can renew it.",
        "conversation.elsewhere": (
            "This button belongs to a conversation in another chat; nothing was changed."
        ),
        "conversation.left_project": (
            "This chat is no longer bound to project {project}: this message starts a new "
            "conversation outside it."
        ),
        "run.toast.not_yours": "not yours to cancel",
        "run.toast.cancelling": "cancelling",
        "command.private_only": "Send /amux to the bot in a private chat.",
        "command.text_only": (
            "Please write your request as text (text, rich text, images, files, voice messages, "
            "videos, shares, cards and forwarded chats are read)."
        ),
        "message.sticker": "A sticker alone gives the Agent nothing to read: please write your "
        "request as text.",
        "forward.title": "Forwarded messages",
        "btw.title": "By the way: {question}",
        "btw.usage": (
            "Send /btw followed by your question: it is answered beside the conversation."
        ),
        "btw.unsupported": "/btw is not supported by {provider}.",
        "btw.cannot_fork": (
            "/btw needs a conversation with a finished turn, outside a project: nothing to fork "
            "yet."
        ),
        "compact.title": "Compacting the conversation",
        "compact.usage": "/compact takes no words: it compacts this topic's conversation.",
        "compact.unsupported": "/compact is not supported by {provider}.",
        "topic.no_conversation": (
            "This topic has no conversation yet: send your request first, then this command in "
            "its topic."
        ),
        "topic.not_yours": (
            "This topic's conversation is someone else's: only who may continue it can change it."
        ),
        "model.current": (
            "Model of this conversation: {model} ({provider}). Models you may choose: {allowed}. "
            "Send /model NAME to choose one."
        ),
        "model.default": "the Agent's default",
        "model.none_listed": "none (the owner lists them in AMUX_FEISHU_MODELS)",
        "model.refused": (
            "{model} is not a model this Hub allows for {provider}; nothing changed. Models you "
            "may choose: {allowed}."
        ),
        "model.set": (
            "This conversation's next turns run {model}; a turn already running keeps its model."
        ),
        "turn.waiting": (
            "This message waits for the running turn to end; then this topic's waiting messages "
            "({count} so far) run as its next turns, each person's together as one turn of theirs."
        ),
        "forward.unavailable": (
            "The forwarded messages could not be read ({reason}): the Agent does not see them."
        ),
        "provider.set": "New conversations in this chat now run {provider}.",
        "feishu.connect.open": (
            "To let amux read Feishu documents as you, open {url} and enter the code {code} "
            "within {minutes} minutes. amux asks only to read documents, wikis, sheets and "
            "bitables ({scopes})."
        ),
        "feishu.connect.done": (
            "Your Feishu account is connected: links you send are read as you ({scopes}). "
            "Send /amux disconnect to stop."
        ),
        "feishu.connect.failed": (
            "Feishu was not connected ({reason}). Send /amux connect to try again."
        ),
        "feishu.disconnect.done": (
            "Your Feishu account is disconnected: Feishu revoked amux's token and amux no longer "
            "holds it."
        ),
        "feishu.disconnect.unrevoked": (
            "Your Feishu account is disconnected and amux no longer holds its token, but Feishu "
            "did not confirm revoking it ({reason}): to be sure, remove amux's access in "
            "Feishu's settings."
        ),
        "feishu.disconnect.none": "No Feishu account of yours is connected.",
        "manage.feishu.none": (
            "**Feishu account**: not connected; documents you link are not read."
        ),
        "manage.feishu.connected": (
            "**Feishu account**: connected; documents you link are read as you ({scopes})."
        ),
        "manage.feishu.connect": "Connect Feishu account",
        "manage.feishu.disconnect": "Disconnect Feishu account",
        "document.not_connected": (
            "Not read: {urls}. Documents are read only as you: send /amux connect to the bot "
            "in a private chat first."
        ),
        "document.unreadable": (
            "Not read: {url} ({reason}). Check that your Feishu account can open it, or send "
            "/amux connect again."
        ),
        "document.over_bound": "Not read: {url} (over this turn's limit of linked documents).",
        "project.bound": (
            "This chat is now bound to project **{project}**: each new conversation works on a "
            "branch of its own from {branch}. {memory}"
        ),
        "project.memory.group": (
            "Turns here share the project's memory; nobody's own memory enters them."
        ),
        "project.memory.private": "Turns here keep your own memory.",
        "project.unbound": (
            "This chat is no longer bound to project **{project}**; new conversations work as "
            "before, and the next message in one of its topics starts a new conversation outside "
            "the project (its branches stay)."
        ),
        "project.current": "This chat is bound to project **{project}** (from {branch}).",
        "project.none": (
            "This chat is bound to no project. The owner binds one with /amux project bind NAME."
        ),
        "project.usage": "Use /amux project bind NAME, or /amux project unbind.",
        "project.memory_button": "Project memory",
        "project.memory_hint": (
            "The memory of project **{project}** is this group's: anyone here may read it; only "
            "the owner changes it from a card."
        ),
        "progress.project": "Project **{project}** · branch `{branch}`",
        "result.branch": "**Branch** `{branch}` from {base}: {count} file(s) changed",
        "result.branch.none": "**Branch** `{branch}` from {base}: no change",
        "result.branch.more": "… and {more} more",
        "result.branch.binary": "binary",
        "result.branch.too_large": "over 1 MiB, not diffed",
        "result.diff_file": "The diff against {base} follows as a file.",
        "result.pull_request": "**Pull request** {url}",
        "result.pull_request.open": "Open pull request",
        "result.pull_request.update": "Update pull request",
        "result.pull_request.title": "Pull request",
        "result.pull_request.opened": "Pull request opened from this conversation's branch: {url}",
        "result.pull_request.updated": "Pull request updated with this turn's answer: {url}",
        "result.pull_request.toast.opened": "Pull request opened",
        "result.pull_request.toast.updated": "Pull request updated",
        "result.diff_truncated": (
            "The diff was cut short (at most 256 KiB); its last lines say what it leaves out."
        ),
        "result.diff_unchanged": "The diff is the same as the last one posted.",
        "manage.projects": (
            "**Projects**: git repositories chats work in, each conversation on a branch of its own"
        ),
        "manage.projects.none": "No projects yet.",
        "manage.projects.add_hint": (
            "Add a project on the Hub's host with `amux project add NAME --path /path/to/repo` "
            "(or `--remote URL`); `amux project remove NAME` removes one no chat is bound to."
        ),
        "manage.projects.line": (
            "**{name}** · {kind} `{source}` from `{branch}` · Agent `{provider}`{policy}"
        ),
        "manage.projects.kind.path": "repository",
        "manage.projects.kind.remote": "remote",
        "manage.projects.policy": " · permissions **{policy}**",
        "manage.projects.no_chats": "- no chat is bound to it",
        "manage.projects.more_chats": "… and {more} more chats: `amux project show {name}`",
        "manage.projects.more": "… and {more} more projects: `amux project list`",
        "manage.projects.group": "group {chat}",
        "manage.projects.chat": "chat {chat}",
        "manage.projects.private": "{person}'s private chat",
        "manage.projects.unbind": "Unbind",
        "manage.projects.bind_title": (
            "**Bind a chat**: its new conversations work in the project; under isolation a "
            "group's share the project's memory, a private chat's keep its person's"
        ),
        "manage.projects.choose_chat": "Choose a chat",
        "manage.projects.choose_project": "Choose a project",
        "manage.projects.bind": "Bind",
        "manage.projects.nothing_to_bind": (
            "No unbound chat to offer: the card offers the groups the bot was @mentioned in and "
            "the private chats it was written to. In any chat, `/amux project bind NAME` binds it."
        ),
        "manage.projects.bound": "Bound {chat} to project **{project}**.",
        "manage.projects.unbound": "Unbound {chat} from project **{project}**.",
        "manage.projects.refused": "**Nothing changed**: {reason} (`{code}`)",
        "manage.projects.pick_chat": "choose a chat to bind",
        "manage.projects.pick_project": "choose the project to bind it to",
        "manage.projects.unknown_chat": (
            "the bot knows no chat {chat}; send /amux project bind NAME in that chat"
        ),
        "manage.projects.already_bound": (
            "{chat} is bound to project **{project}** already; unbind it first"
        ),
        "manage.projects.not_bound": "{chat} is bound to no project",
        "manage.projects.moved": (
            "{chat} is bound to project **{project}** now, not **{shown}**; open /amux again"
        ),
        "manage.worktree_days": (
            "**Checkouts kept unused**: **{days}** days, then removed at the project's next "
            "turn (their branches stay). Saved at once."
        ),
        "provider.choose": "choose one of {providers}",
        "provider.no_chat": "this card does not name a chat",
        "claim.refused.wrong": "That claim code is not valid.",
        "claim.refused.expired": (
            "That claim code has expired (codes last {minutes} minutes). Restart amux serve "
            "and send the new code from its log."
        ),
        "claim.refused.used": "That claim code was already used; a code works only once.",
        "claim.refused.burnt": (
            "That claim code was posted where others could read it, so it no longer works. The "
            "new code is in amux serve's log; send it to the bot here, in this private chat."
        ),
        "claim.burnt": (
            "A claim code was posted here, where others can read it, so it no longer works. The "
            "owner finds a new code in amux serve's log and sends it to the bot in a private chat."
        ),
        "claim.refused.locked": (
            "Too many wrong claim codes: claims from you are refused for {lock_minutes} "
            "minutes, even with the right code."
        ),
        "claim.refused.locked_for_all": (
            "Too many wrong claim codes: claiming is locked. Restart amux serve and send the "
            "new code from its log."
        ),
        "usage.tokens": "{input} in / {output} out",
        "budget.title": "Token budget",
        "budget.reached.day": (
            "Today's token budget is spent: {used} of {allowance} tokens (UTC day)."
        ),
        "budget.reached.turn": "This turn reached its token budget: {used} of {allowance} tokens.",
        "budget.warning.day": (
            "⚠ {share} % of today's token budget is spent: {used} of {allowance} tokens (UTC day)."
        ),
        "budget.warning.turn": (
            "⚠ This turn used {share} % of its token budget: {used} of {allowance} tokens."
        ),
        "budget.warning.running": "⚠ 80 % of the tokens this turn may use are spent.",
        "budget.refused": "Not started: there are no tokens left for it.",
        "budget.asked": "The owner of this Hub has been asked to extend it.",
        "budget.ask_owner": "Ask the owner of this Hub to extend it.",
        "budget.request": "**{name}** needs more tokens.",
        "budget.extend": "Extend (+{tokens} today)",
        "catchup.title": "Sent while I was away",
        "catchup.body": (
            "This message reached me {minutes} min after it was sent, while I was offline, so I "
            "did not run it: it may no longer be wanted. Its sender can run it now."
        ),
        "catchup.run": "Run it now",
        "catchup.started": "Running it now, as asked.",
        "catchup.not_yours": "Only the person who sent this message can run it.",
        "catchup.done": "This message was run already.",
        "budget.extended": "{tokens} tokens added to today's budget of {name}",
        "budget.already": (
            "Already extended: {tokens} tokens were added to {name}'s budget for {day}."
        ),
        "budget.expired": (
            "This request was for {day}: an extension counts for its own day only, so this card "
            "adds nothing today. A new request comes when a turn needs one."
        ),
        "budget.outdated": (
            "This card is out of date and extends nothing: use the latest request, or "
            "amux usage extend."
        ),
        "usage.elapsed": "{seconds} s",
        "result.title": "Result",
        "result.part": "Result ({index}/{total})",
        "result.memory": "**Memory**",
        "result.memory.none": "Memory not used.",
        "result.memory.read": "Read: {paths}",
        "result.memory.searched": "Searched memory {count} time(s).",
        "result.memory.saved": "Saved {path} ({revision})",
        "result.memory.forgot": "Forgot {path}",
        "result.memory.undo": "Undo",
        "memory.undo.done": "Undone: {path} is back at {revision}.",
        "memory.undo.removed": "Undone: {path} was removed.",
        "memory.undo.changed": "{path} changed since; nothing was undone.",
        "memory.undo.not_yours": "Only the owner of this memory can undo its changes.",
        "approval.title.pending": "Permission needed",
        "approval.title.allowed": "Allowed",
        "approval.title.denied": "Denied",
        "approval.wants.command": "**{tool}** wants to run a command:",
        "approval.wants.edit": "**{tool}** wants to change a file:",
        "approval.wants.tool": "**{tool}** wants to use a tool:",
        "approval.file_detail": "──── and what it changes or is given ({count} characters) ────",
        "approval.expires": "Waits for an answer until {when}; unanswered, it is denied.",
        "approval.asked_of": "For {name} to answer, or the Hub owner.",
        "approval.allow_once": "Allow once",
        "approval.allow_session": "Allow for this conversation",
        "approval.deny": "Deny",
        "approval.allowed_once": "Allowed once by {name} · {when}",
        "approval.allowed_session": "Allowed for this conversation by {name} · {when}",
        "approval.allowed_rule": "Allowed by a rule of this conversation · {when}",
        "approval.denied_person": "Denied by {name} · {when}",
        "approval.denied_timeout": "Denied: nobody answered in time · {when}",
        "approval.lapsed": (
            "Lapsed: the turn was handed back, and asks again when it runs · {when}"
        ),
        "approval.unanswered": "Not answered",
        "approval.reason": "Reason: {reason}",
        "approval.someone": "someone",
        "approval.more": "{count} earlier request(s) not shown.",
        "approval.more_pending": (
            "{count} more request(s) wait; each shows here once the ones above are answered."
        ),
        "approval.subject_in_file": (
            "Too long for this card ({count} characters): the whole of it is in the file {name} "
            "posted in this topic. Read it there before you answer."
        ),
        "approval.subject_unseen": (
            "Too long for this card ({count} characters), and the file with the whole of it could "
            "not be posted: it can only be denied here."
        ),
        "approval.subject_cut": "Too long for this card ({count} characters); its start is shown.",
        "approval.toast.allow_once": "Allowed once",
        "approval.toast.allow_session": "Allowed for this conversation",
        "approval.toast.deny": "Denied",
        "approval.toast.not_yours": (
            "Only the person whose turn this is, or the Hub owner, can answer this request."
        ),
        "approval.toast.answered": "Already answered: {outcome}",
        "approval.toast.gone": "This request is no longer known.",
        "progress.approval.asked": "Waiting for permission: {request} (answer on the card below)",
        "progress.approval.settled": "{request}: {outcome}",
        "result.approvals": "**Permissions**",
        "result.approvals.rules": "Allowed for this conversation: {rules}",
        "manage.agents": "**Agents' permissions**: what an Agent may do without asking",
        "manage.permissions": "Policy: **{policy}**",
        "manage.permissions.ask": "Ask",
        "manage.permissions.auto": "Auto",
        "manage.permissions.read-only": "Read-only",
        "manage.permissions.explain": (
            "Ask: file edits and changing commands wait for an answer in the chat. Auto: "
            "everything inside the sandbox runs. Read-only: the workspace cannot be changed."
        ),
        "manage.approval_timeout": (
            "**Approval timeout**: an unanswered request is denied after **{timeout}**"
        ),
        "manage.budget.daily": "**Tokens per person per day** (UTC): **{tokens}**",
        "manage.budget.turn": "**Tokens per turn**: **{tokens}**",
        "manage.live": (
            "These are saved at once and apply to turns started after the change; no restart."
        ),
        "value.seconds": "{seconds} s",
        "value.minutes": "{minutes} min",
        "value.hours": "{hours} h",
        "error.title": "Something went wrong",
        "error.code": "Error code `{code}`",
        "error.detail": "Detail: {message}",
        "error.about.agent_protocol": "The Agent's program answered in a way amux does not know.",
        "error.about.binding_mismatch": (
            "This conversation's memory belongs to another scope now: start a new conversation."
        ),
        "error.about.conflict": "It changed meanwhile: open it again and retry.",
        "error.about.executable_missing": "The Agent's program is not installed on the worker.",
        "error.about.executable_unreachable": (
            "The Agent's program is installed where the Agent's user cannot reach it."
        ),
        "error.about.feishu_api_error": "Feishu refused the request.",
        "error.about.forbidden": "You may not do this.",
        "error.about.internal": "amux failed unexpectedly; the owner can find why in its log.",
        "error.about.invalid_argument": "The request was not understood.",
        "error.about.invalid_path": "That is not a valid memory path.",
        "error.about.feishu_not_connected": (
            "Feishu is read only with your own account, and it is not connected: send /amux "
            "connect in your private chat with the bot."
        ),
        "error.about.feishu_refused": "Feishu would not give your account this document.",
        "error.about.feishu_unavailable": "Feishu is not reachable from this Hub right now.",
        "error.about.memory_disabled": "Agent memory is off on this Hub.",
        "error.about.native_memory_unconfirmed": (
            "The Agent's own memory could not be turned off, so it was not started."
        ),
        "error.about.not_found": "It is not there (any more).",
        "error.about.payload_too_large": "It is too large.",
        "error.about.quota_exceeded": "A limit was reached.",
        "error.about.sandbox_unavailable": (
            "No sandbox could be had for the Agent right now: the cluster gave none in time."
        ),
        "error.about.request_timeout": "It took too long.",
        "error.about.storage_unavailable": "amux cannot write to its storage right now.",
        "error.about.forge_unavailable": "The project's forge refused, or did not answer.",
        "error.about.unauthenticated": "amux does not know who you are.",
        "error.about.unavailable": "amux or Feishu is unavailable right now: try again shortly.",
        "error.about.unsupported_encoding": "The text is not in an encoding amux reads.",
        "warning.title": "Notice",
        "notice.memory_disabled.title": "Memory unavailable",
        "notice.memory_disabled": "Agent memory is off on this Hub. The owner can enable it in "
        "/amux → Experiments.",
        "notice.memory_disabled.erase_hint": (
            "Your memory documents are kept while it is off. You can still erase them for good."
        ),
        "notice.memory_disabled.erase": "Erase my memory…",
        "comment.long": (
            "The answer is longer than a comment reply takes: all of it is in your private chat "
            "with the bot."
        ),
        "comment.cut": (
            "The answer is cut short here: the rest could not be sent to your private chat with "
            "the bot. Open a private chat with it and ask again."
        ),
        "comment.title": "Answer to your comment",
        "comment.failed": "The Agent could not answer: {reason}",
        "comment.stopped": "The turn was stopped before the Agent answered.",
        "comment.refused": "Nothing was run: {reason}",
        "comment.empty": "Write what you want the Agent to do after the @mention.",
        "comment.unreadable": "This comment could not be read, so nothing was run: {reason}",
        "comment.own_thread": (
            "This comment thread is another member's conversation and memory is isolated per "
            "person. Start a comment of your own to talk to the Agent."
        ),
        "notice.enrollment_closed.title": "Not enrolled",
        "notice.enrollment_closed": (
            "This Hub does not accept new members right now. Ask its owner to add you."
        ),
        "notice.own_topic.title": "Open your own topic",
        "notice.own_topic": (
            "This topic belongs to another member and memory is isolated per person. Start your "
            "own topic to talk to the assistant."
        ),
        "notice.owner_only.title": "Owner only",
        "notice.owner_only": "Only the owner of this Hub can change its settings.",
        "notice.owner_only.toast": "Only the owner of this Hub can do this.",
        "notice.project_memory": (
            "This group shares the memory of project **{project}**: only the owner of this Hub "
            "changes or erases it from a card. Turns in this group still read and save it."
        ),
        "notice.stale_card": "This card is out of date. Open /amux again.",
        "notice.try_later.title": "Try again later",
        "notice.try_later.messages": (
            "You sent more than {limit} messages in a minute, the most one person may. Try again "
            "in {seconds} s; new messages until then are not answered."
        ),
        "notice.try_later.queued": (
            "{limit} of your turns are already waiting for a free Agent slot, the most one "
            "person may queue. Try again in about {seconds} s, once one of them has started."
        ),
        "schedule.run.title": "⏰ {name}",
        "schedule.run.clock": "Scheduled run for {time}, as **{creator}**.",
        "schedule.run.manual": "Run now, asked at {time}, as **{creator}**.",
        "schedule.run.trigger": "Started by a request to this trigger at {time}, as **{creator}**.",
        "schedule.added": "Added schedule {name} ({id}); next run {time}.",
        "schedule.added_trigger": (
            "Added trigger {name} ({id}). Its secret is sent to you in our private chat."
        ),
        "schedule.paused": "Paused schedule {name} ({id}).",
        "schedule.resumed": "Resumed schedule {name} ({id}); next run {time}.",
        "schedule.removed": "Removed schedule {name} ({id}).",
        "schedule.run_asked": "Schedule {name} ({id}) runs now, in a topic of its own.",
        "schedule.none": "No schedules deliver into this chat.",
        "manage.schedules": "**Schedules**",
        "manage.schedules.none": (
            'None yet. In a chat, `/amux schedule add "0 9 * * 1-5" <prompt>` runs a prompt '
            "there on a clock, as you."
        ),
        "manage.schedules.line": (
            "**{name}** `{when}` · by {creator} · next: {next} · last: {last}"
        ),
        "manage.schedules.more": "{more} more: `amux schedule list` shows them all.",
        "schedule.button.pause": "Pause",
        "schedule.button.resume": "Resume",
        "schedule.button.run": "Run now",
        "schedule.button.remove": "Remove",
        "schedule.skipped": (
            "Schedule {name} ({id}) did not run now: its last run is still running."
        ),
        "schedule.list.title": "Schedules of this chat:",
        "schedule.list.line": "{id} · {name} · {when} · next: {next} · last: {last}",
        "schedule.list.paused": "paused",
        "schedule.list.no_next": "none",
        "schedule.not_here": "Schedule {id} does not deliver into this chat.",
        "schedule.refused": "Not done: {reason}",
        "schedule.usage": (
            'Usage: /amux schedule add "<cron or YYYY-MM-DD HH:MM>" <prompt> | list | '
            "pause <id> | resume <id> | remove <id> | run <id>"
        ),
        "schedule.missed": (
            "Schedule {name} ({id}) missed {count} run(s) from {time} while amux was not running; "
            "they are not run late."
        ),
        "schedule.paused.failures": (
            "Schedule {name} ({id}) is paused: its last three runs failed (the last: {reason}). "
            "Resume it with /amux schedule resume {id}."
        ),
        "schedule.paused.creator_gone": (
            "Schedule {name} ({id}) is paused: the person who made it is no longer a member."
        ),
    },
    "zh_cn": {
        "schedule.run.title": "⏰ {name}",
        "schedule.run.clock": "定时运行，计划时间 {time}，以 **{creator}** 的身份。",
        "schedule.run.manual": "立即运行，请求于 {time}，以 **{creator}** 的身份。",
        "schedule.run.trigger": "由对此触发器的请求于 {time} 启动，以 **{creator}** 的身份。",
        "schedule.added": "已添加定时任务 {name}（{id}）；下次运行 {time}。",
        "schedule.added_trigger": "已添加触发器 {name}（{id}）。它的密钥已在我们的私聊中发给你。",
        "schedule.paused": "已暂停定时任务 {name}（{id}）。",
        "schedule.resumed": "已恢复定时任务 {name}（{id}）；下次运行 {time}。",
        "schedule.removed": "已删除定时任务 {name}（{id}）。",
        "schedule.run_asked": "定时任务 {name}（{id}）现在运行，在它自己的话题中。",
        "schedule.none": "没有定时任务向此会话发送结果。",
        "manage.schedules": "**定时任务**",
        "manage.schedules.none": (
            '还没有。在会话中用 `/amux schedule add "0 9 * * 1-5" <提示词>` '
            "按时以你的身份在那里运行一个提示词。"
        ),
        "manage.schedules.line": (
            "**{name}** `{when}` · 创建者 {creator} · 下次：{next} · 上次：{last}"
        ),
        "manage.schedules.more": "还有 {more} 个：`amux schedule list` 列出全部。",
        "schedule.button.pause": "暂停",
        "schedule.button.resume": "恢复",
        "schedule.button.run": "立即运行",
        "schedule.button.remove": "删除",
        "schedule.skipped": "定时任务 {name}（{id}）这次没有运行：它的上一次运行仍在进行。",
        "schedule.list.title": "此会话的定时任务：",
        "schedule.list.line": "{id} · {name} · {when} · 下次：{next} · 上次：{last}",
        "schedule.list.paused": "已暂停",
        "schedule.list.no_next": "无",
        "schedule.not_here": "定时任务 {id} 不向此会话发送结果。",
        "schedule.refused": "未完成：{reason}",
        "schedule.usage": (
            '用法：/amux schedule add "<cron 表达式或 YYYY-MM-DD HH:MM>" <提示词> | list | '
            "pause <id> | resume <id> | remove <id> | run <id>"
        ),
        "schedule.missed": (
            "定时任务 {name}（{id}）在 amux 未运行期间错过了自 {time} 起的 {count} 次运行；"
            "这些运行不会补跑。"
        ),
        "schedule.paused.failures": (
            "定时任务 {name}（{id}）已暂停：最近三次运行都失败了（最后一次：{reason}）。"
            "用 /amux schedule resume {id} 恢复它。"
        ),
        "schedule.paused.creator_gone": ("定时任务 {name}（{id}）已暂停：创建它的人已不再是成员。"),
        "manage.title": "amux 管理",
        "manage.identity": "**你是** {name}（`{principal}`，{kind}）",
        "manage.kind.user": "用户",
        "manage.kind.service": "服务",
        "manage.role.owner": "本 Hub 的所有者",
        "manage.role.member": "成员",
        "manage.scope": "**记忆范围** `{scope}`",
        "manage.scope.global": "全局记忆，所有已授权的 Agent 共享",
        "manage.scope.principal": "你自己的记忆，与其他成员隔离",
        "manage.member_hint": "只有所有者可以修改 Hub 设置。你可以查看自己的记忆。",
        "manage.experiments": "**实验功能**",
        "manage.memory_switch": "Agent 记忆",
        "manage.isolation_switch": "用户隔离",
        "manage.values": "已保存：**{saved}**，运行中：**{running}**",
        "manage.history": "**历史保留**：被覆盖或遗忘的文档可恢复的天数",
        "manage.restart_pending": "待重启：已保存的值将在下次 Hub 重启后生效。",
        "manage.unsaved": "你有尚未保存的修改。",
        "manage.stale": (
            "**未保存任何修改**：在此卡片显示之后，这些设置已在别处被修改。卡片现在显示当前的值；"
            "请重新选择并保存。"
        ),
        "manage.save": "保存",
        "manage.my_memory": "我的记忆",
        "manage.provider": "**本会话的 Agent** `{provider}`（用于新的对话）",
        "manage.restarted": "Hub 已重启，下方的运行值现已生效。",
        "manage.fair_share": "**公平分配**：任何一个人都不能独占 Agent",
        "manage.max_queued": "**每人排队轮次**：超出的会被拒绝，并告知何时再试",
        "manage.messages_per_minute": "**每人每分钟消息数**：超出的不会开始，并告知何时再试",
        "value.on": "开",
        "value.off": "关",
        "value.days": "{days} 天",
        "value.no_limit": "不限",
        "restart.title": "已保存：重启后生效",
        "restart.changes": (
            "**已保存** Agent 记忆：{memory}；用户隔离：{isolation}；历史保留：{history}"
        ),
        "restart.body": (
            "保存不会改变正在运行的策略。重启时不再开始新的 Agent 任务，进行中的任务最多等待 "
            "AMUX_DRAIN_SECONDS（默认 2 分钟）完成；仍未完成的会交回队列，重启后从头重新运行，"
            "其卡片会继续更新。然后 Hub 以已保存的值重新启动。\n"
            "- 开启 Agent 记忆：新会话可以读取和保存记忆。没有记忆绑定的已有会话不会自动迁移，"
            "首次开启后请新建会话。\n"
            "- 关闭 Agent 记忆：记忆工具调用会被拒绝，文件会保留。已绑定的会话保留协议，"
            "在重新开启前记忆调用会失败。\n"
            "- 用户隔离决定成员共享一份全局记忆，还是每人各自一份。\n"
            "- 历史保留：被覆盖或遗忘的文档可恢复的天数。Hub 启动时，早于该期限的旧版本"
            "（关闭时为全部旧版本）会被删除。\n"
            "- 公平分配：某人超出排队上限的轮次、超出每分钟上限的消息，会收到何时再试的回复，"
            "而不会开始运行。"
        ),
        "restart.when": "请在空闲时重启：进行中的 Agent 任务最多有 2 分钟完成。",
        "restart.now": "立即重启",
        "restart.later": "稍后",
        "restart.scheduled": (
            "正在重启：不再开始新的 Agent 任务；进行中的任务完成，或交回队列在重启后重新运行。"
            "恢复后此卡片会显示新的运行状态。"
        ),
        "restart.deferred": "未重启。已保存的值将在下次重启时生效。",
        "memory.title": "我的记忆",
        "memory.scope": "范围 `{scope}`",
        "memory.project": "项目 **{project}** 的记忆，由本群的轮次共享。",
        "memory.empty": "这里还没有记忆文档。",
        "memory.truncated": "还有更多文档；请缩小前缀或使用搜索。",
        "memory.open": "打开",
        "memory.search_placeholder": "字面关键词，例如 评审报告",
        "memory.search": "搜索",
        "memory.search_title": "搜索：{query}",
        "memory.no_hits": "没有匹配结果。试试其他字面关键词或已知路径。",
        "memory.incomplete": "搜索达到扫描上限，结果可能不完整。",
        "memory.search_empty": "请输入要搜索的关键词",
        "memory.gone": "{path} 已不存在",
        "memory.document_title": "{path}",
        "memory.revision": "版本 `{revision}`",
        "memory.more": "继续阅读",
        "memory.forget": "遗忘",
        "memory.back": "返回列表",
        "memory.forget_title": "遗忘这篇文档？",
        "memory.forget_body": (
            "将删除 **{path}**（版本 `{revision}`）。如果打开后它已被修改，则不会删除，"
            "并提示你重新查看。\n"
            "已读入会话的内容仍会留在会话中；其他文档中的副本也会保留。"
        ),
        "memory.forget_confirm": "遗忘",
        "memory.forget_cancel": "保留",
        "memory.forgotten_title": "已遗忘",
        "memory.forgotten": "**{path}** 已删除。",
        "memory.private_chat_only": (
            "你的记忆只在你与机器人的私聊中显示，那里卡片的改动只有你自己能看到"
            "（如果这里就是那个私聊，请先在这里给机器人发一条消息）。"
        ),
        "memory.already_absent": "**{path}** 早已不存在。",
        "memory.changes": "**最近的修改**",
        "memory.changes_title": "我的记忆的修改记录",
        "memory.no_changes": "暂无修改记录。",
        "memory.change": "{when} · {action} {path} · 来自 {by}",
        "memory.change.by_conversation": "会话 `{session}`",
        "memory.change.by_person": "{name}（{via}）",
        "memory.change.restorable": "旧版本可恢复至 {until}",
        "memory.restore": "恢复此版本",
        "memory.restored": "**{path}** 已恢复到版本 `{revision}`。",
        "memory.restored_title": "已恢复",
        "memory.history": "修改记录",
        "memory.erase": "彻底删除…",
        "memory.erase_title": "确定彻底删除？",
        "memory.erase_body": (
            "将删除 **{documents}** 篇文档（{what}）、**{copies}** 个保留的旧版本，并在 "
            "**{entries}** 条修改记录中抹去路径。此操作无法撤销。"
        ),
        "memory.erase_all": "你的全部记忆",
        "memory.erase_kept": (
            "保留了 **{count}** 篇其他人也修改过的共享文档：{paths}。"
            "彻底删除只移除无人修改过的内容；其余的请找修改者或所有者删除。"
        ),
        "memory.erase_confirm": "彻底删除",
        "memory.erased_title": "已彻底删除",
        "memory.erased": (
            "已删除 {documents} 篇文档和 {copies} 个保留的旧版本；"
            "{entries} 条修改记录中的路径已被抹去。"
        ),
        "memory.not_erased": "Agent 自己保存的对话记录属于会话历史，不是记忆，不会被删除。",
        "progress.title.queued": "排队中",
        "progress.title.running": "处理中",
        "progress.title.done": "已完成",
        "progress.title.failed": "失败",
        "progress.title.cancelled": "已取消",
        "progress.elapsed": "已用时 {seconds} 秒",
        "progress.plan": "**计划**（已完成 {done}/{total}）",
        "progress.steps": "**步骤**（{count}）",
        "footer.context": "上下文已用 {percent}%",
        "footer.compact": "上下文已用 {percent}%：可考虑 `/compact`。",
        "progress.steps.earlier": "… 之前另有 {more} 步",
        "step.read": "读取",
        "step.edit": "编辑",
        "step.run": "运行",
        "step.search": "搜索",
        "step.tool": "工具",
        "step.compact": "已压缩对话的上下文",
        "progress.cancel": "停止",
        "progress.stopped_by": "已由 **{name}** 停止。",
        "progress.recalled_by": "已由 **{name}** 撤回：不再回答此请求。",
        "recall.by_sender": "发送者",
        "recall.by_admin": "群管理员",
        "progress.restarting": "Hub 正在重启：恢复后此卡片会继续更新。",
        "context.unavailable": "无法读取话题中之前的消息（{reason}）：Agent 只看到这条消息。",
        "conversation.new": "新对话",
        "files.refused": "未读取：{items}",
        "outbox.refused": (
            "本轮有一条消息无法在这里显示：飞书拒收了它。对话仍保留着回答："
            "在本话题中再问一次即可看到，可要求更短或分段。"
        ),
        "conversation.renewed": "此话题中的下一条消息将开始新的对话。",
        "conversation.not_yours": "只有发起此对话的人可以开始新对话。",
        "conversation.elsewhere": "此按钮属于另一个会话中的对话；未做任何修改。",
        "conversation.left_project": (
            "本会话已不再绑定项目 {project}：这条消息将在项目之外开始新的对话。"
        ),
        "run.toast.not_yours": "只有发起此轮次的人或 Hub 所有者可以停止它",
        "run.toast.cancelling": "正在停止",
        "command.private_only": "请在与机器人的私聊中发送 /amux。",
        "command.text_only": (
            "请用文字描述你的请求（读取文字、富文本、图片、文件、语音、视频、分享、卡片和合并转发的聊天记录）。"
        ),
        "message.sticker": "单独一个表情包没有可供 Agent 读取的内容：请用文字描述你的请求。",
        "forward.title": "转发的消息",
        "btw.title": "顺便问一下：{question}",
        "btw.usage": "请在 /btw 后面写上你的问题：它会在对话之外单独回答。",
        "btw.unsupported": "{provider} 不支持 /btw。",
        "btw.cannot_fork": (
            "/btw 需要一个已完成过一轮、且不属于项目的对话：目前还没有可以分叉的会话。"
        ),
        "compact.title": "正在压缩对话",
        "compact.usage": "/compact 不带参数：它压缩本话题的对话。",
        "compact.unsupported": "{provider} 不支持 /compact。",
        "topic.no_conversation": "这个话题还没有对话：请先发送你的请求，再在该话题中发送此命令。",
        "topic.not_yours": "这个话题的对话属于别人：只有可以继续该对话的人才能更改它。",
        "model.current": (
            "本对话的模型：{model}（{provider}）。可选的模型：{allowed}。"
            "发送 /model 模型名 以选择。"
        ),
        "model.default": "Agent 的默认模型",
        "model.none_listed": "无（由所有者在 AMUX_FEISHU_MODELS 中列出）",
        "model.refused": (
            "{model} 不是本 Hub 允许 {provider} 使用的模型；未做更改。可选的模型：{allowed}。"
        ),
        "model.set": "本对话之后的轮次将使用 {model}；正在运行的轮次保持原模型。",
        "turn.waiting": (
            "这条消息将等待当前轮次结束；随后本话题等待中的消息（目前 {count} 条）"
            "依次运行，每个人的消息合并为以其本人身份运行的一轮。"
        ),
        "forward.unavailable": "无法读取转发的消息（{reason}）：Agent 看不到它们。",
        "provider.set": "本会话的新对话将使用 {provider}。",
        "feishu.connect.open": (
            "要让 amux 以你的身份读取飞书文档，请在 {minutes} 分钟内打开 {url} "
            "并输入验证码 {code}。"
            "amux 只申请读取文档、知识库、电子表格和多维表格（{scopes}）。"
        ),
        "feishu.connect.done": (
            "你的飞书账号已连接：你发送的链接将以你的身份读取（{scopes}）。"
            "发送 /amux disconnect 可断开。"
        ),
        "feishu.connect.failed": "飞书账号未连接（{reason}）。发送 /amux connect 重试。",
        "feishu.disconnect.done": "你的飞书账号已断开：飞书已撤销 amux 的令牌，amux 不再保存它。",
        "feishu.disconnect.unrevoked": (
            "你的飞书账号已断开，amux 不再保存其令牌，但飞书未确认撤销授权（{reason}）："
            "如需确认，请在飞书设置中移除 amux 的授权。"
        ),
        "feishu.disconnect.none": "你没有已连接的飞书账号。",
        "manage.feishu.none": "**飞书账号**：未连接；你发送的文档链接不会被读取。",
        "manage.feishu.connected": (
            "**飞书账号**：已连接；你发送的文档链接以你的身份读取（{scopes}）。"
        ),
        "manage.feishu.connect": "连接飞书账号",
        "manage.feishu.disconnect": "断开飞书账号",
        "document.not_connected": (
            "未读取：{urls}。文档只以你的身份读取：请先在与机器人的私聊中发送 /amux connect。"
        ),
        "document.unreadable": (
            "未读取：{url}（{reason}）。请确认你的飞书账号能打开它，或重新发送 /amux connect。"
        ),
        "document.over_bound": "未读取：{url}（超出本轮链接文档的上限）。",
        "project.bound": (
            "本会话已绑定到项目 **{project}**：每个新对话都在从 {branch} 创建的独立分支上"
            "工作。{memory}"
        ),
        "project.memory.group": "这里的轮次共享项目的记忆，不会带入任何人自己的记忆。",
        "project.memory.private": "这里的轮次使用你自己的记忆。",
        "project.unbound": (
            "本会话已不再绑定项目 **{project}**；新对话恢复原样，其话题中的下一条消息将在项目之外"
            "开始新的对话（其分支保留）。"
        ),
        "project.current": "本会话绑定的项目是 **{project}**（基于 {branch}）。",
        "project.none": "本会话未绑定项目。所有者可发送 /amux project bind NAME 进行绑定。",
        "project.usage": "请使用 /amux project bind NAME 或 /amux project unbind。",
        "project.memory_button": "项目记忆",
        "project.memory_hint": (
            "项目 **{project}** 的记忆属于本群：这里的任何人都可以查看；"
            "只有所有者可以通过卡片修改。"
        ),
        "progress.project": "项目 **{project}** · 分支 `{branch}`",
        "result.branch": "**分支** `{branch}`（基于 {base}）：{count} 个文件有改动",
        "result.branch.none": "**分支** `{branch}`（基于 {base}）：没有改动",
        "result.branch.more": "… 另有 {more} 个",
        "result.branch.binary": "二进制",
        "result.branch.too_large": "超过 1 MiB，未比较差异",
        "result.diff_file": "相对 {base} 的差异以文件形式随后发送。",
        "result.pull_request": "**合并请求** {url}",
        "result.pull_request.open": "创建合并请求",
        "result.pull_request.update": "更新合并请求",
        "result.pull_request.title": "合并请求",
        "result.pull_request.opened": "已从本对话的分支创建合并请求：{url}",
        "result.pull_request.updated": "已用本轮回答更新合并请求：{url}",
        "result.pull_request.toast.opened": "合并请求已创建",
        "result.pull_request.toast.updated": "合并请求已更新",
        "result.diff_truncated": "差异被截断（最多 256 KiB），文件最后几行说明了未包含的内容。",
        "result.diff_unchanged": "差异与上次发送的相同，不再重复发送。",
        "manage.projects": "**项目**：会话在其中工作的 git 仓库，每个对话使用独立的分支",
        "manage.projects.none": "还没有项目。",
        "manage.projects.add_hint": (
            "在 Hub 所在主机上用 `amux project add NAME --path /path/to/repo`（或 `--remote URL`）"
            "添加项目；`amux project remove NAME` 可删除没有绑定会话的项目。"
        ),
        "manage.projects.line": (
            "**{name}** · {kind} `{source}`，基于 `{branch}` · Agent `{provider}`{policy}"
        ),
        "manage.projects.kind.path": "仓库",
        "manage.projects.kind.remote": "远程",
        "manage.projects.policy": " · 权限 **{policy}**",
        "manage.projects.no_chats": "- 没有绑定的会话",
        "manage.projects.more_chats": "… 另有 {more} 个会话：`amux project show {name}`",
        "manage.projects.more": "… 另有 {more} 个项目：`amux project list`",
        "manage.projects.group": "群 {chat}",
        "manage.projects.chat": "会话 {chat}",
        "manage.projects.private": "{person} 的私聊",
        "manage.projects.unbind": "解除绑定",
        "manage.projects.bind_title": (
            "**绑定会话**：其新对话在项目中工作；开启隔离时群共享项目的记忆，私聊保留其本人的记忆"
        ),
        "manage.projects.choose_chat": "选择会话",
        "manage.projects.choose_project": "选择项目",
        "manage.projects.bind": "绑定",
        "manage.projects.nothing_to_bind": (
            "没有可绑定的会话：卡片列出机器人被 @ 过的群和给它发过消息的私聊。"
            "在任何会话中发送 `/amux project bind NAME` 都可以绑定它。"
        ),
        "manage.projects.bound": "已将{chat}绑定到项目 **{project}**。",
        "manage.projects.unbound": "已解除{chat}与项目 **{project}** 的绑定。",
        "manage.projects.refused": "**未做任何修改**：{reason}（`{code}`）",
        "manage.projects.pick_chat": "请选择要绑定的会话",
        "manage.projects.pick_project": "请选择要绑定到的项目",
        "manage.projects.unknown_chat": (
            "机器人不认识会话 {chat}；请在该会话中发送 /amux project bind NAME"
        ),
        "manage.projects.already_bound": "{chat}已绑定到项目 **{project}**；请先解除绑定",
        "manage.projects.not_bound": "{chat}没有绑定项目",
        "manage.projects.moved": (
            "{chat}现在绑定的是项目 **{project}**，而不是 **{shown}**；请重新打开 /amux"
        ),
        "manage.worktree_days": (
            "**未使用的检出保留**：**{days}** 天，之后在项目的下一轮次时删除（分支会保留）。"
            "立即保存。"
        ),
        "provider.choose": "请选择其中之一：{providers}",
        "provider.no_chat": "此卡片没有指明会话",
        "claim.refused.wrong": "认领码无效。",
        "claim.refused.expired": (
            "认领码已过期（有效期 {minutes} 分钟）。重启 amux serve，使用其日志中的新认领码。"
        ),
        "claim.refused.used": "该认领码已被使用过，不能再次使用。",
        "claim.refused.burnt": (
            "该认领码曾发在他人可见的地方，已经作废。新的认领码在 amux serve 的日志中，"
            "请在这个私聊中发给机器人。"
        ),
        "claim.burnt": (
            "这里发出了认领码，其他人也能看到，它已经作废。所有者可在 amux serve 的日志中找到新的"
            "认领码，并在与机器人的私聊中发送。"
        ),
        "claim.refused.locked": (
            "错误的认领码太多：{lock_minutes} 分钟内不再接受你的认领，正确的认领码也不例外。"
        ),
        "claim.refused.locked_for_all": (
            "错误的认领码太多：认领已锁定。重启 amux serve，使用其日志中的新认领码。"
        ),
        "usage.tokens": "输入 {input} / 输出 {output}",
        "budget.title": "Token 预算",
        "budget.reached.day": "今日 token 预算已用完：{used} / {allowance} 个 token（UTC 日）。",
        "budget.reached.turn": "本轮已达到 token 预算：{used} / {allowance} 个 token。",
        "budget.warning.day": (
            "⚠ 今日 token 预算已用 {share}%：{used} / {allowance} 个 token（UTC 日）。"
        ),
        "budget.warning.turn": (
            "⚠ 本轮已用其 token 预算的 {share}%：{used} / {allowance} 个 token。"
        ),
        "budget.warning.running": "⚠ 本轮可用的 token 已用去 80%。",
        "budget.refused": "未开始处理：已没有可用的 token。",
        "budget.asked": "已请本 Hub 的所有者延长预算。",
        "budget.ask_owner": "请联系本 Hub 的所有者延长预算。",
        "budget.request": "**{name}** 需要更多 token。",
        "budget.extend": "延长（今日 +{tokens}）",
        "catchup.title": "离线期间收到的消息",
        "catchup.body": (
            "这条消息发出 {minutes} 分钟后我才收到（当时我不在线），因此没有执行："
            "它可能已不再需要。发送者可以现在执行它。"
        ),
        "catchup.run": "现在执行",
        "catchup.started": "已按要求开始执行。",
        "catchup.not_yours": "只有这条消息的发送者可以执行它。",
        "catchup.done": "这条消息已经执行过了。",
        "budget.extended": "已为 {name} 的今日预算增加 {tokens} 个 token",
        "budget.already": "已延长过：{name} 在 {day} 的预算已增加 {tokens} 个 token。",
        "budget.expired": (
            "此请求属于 {day}：延长只在当天有效，此卡片今天不会增加 token。需要时会发来新的请求。"
        ),
        "budget.outdated": "此卡片已过期，不会延长预算：请使用最新的请求，或 amux usage extend。",
        "usage.elapsed": "{seconds} 秒",
        "result.title": "结果",
        "result.part": "结果（{index}/{total}）",
        "result.memory": "**记忆**",
        "result.memory.none": "未使用记忆。",
        "result.memory.read": "读取：{paths}",
        "result.memory.searched": "搜索记忆 {count} 次。",
        "result.memory.saved": "保存 {path}（{revision}）",
        "result.memory.forgot": "遗忘 {path}",
        "result.memory.undo": "撤销",
        "memory.undo.done": "已撤销：{path} 已恢复到 {revision}。",
        "memory.undo.removed": "已撤销：{path} 已删除。",
        "memory.undo.changed": "{path} 此后已被修改，未做撤销。",
        "memory.undo.not_yours": "只有这份记忆的主人可以撤销它的修改。",
        "approval.title.pending": "需要授权",
        "approval.title.allowed": "已允许",
        "approval.title.denied": "已拒绝",
        "approval.wants.command": "**{tool}** 想要运行命令：",
        "approval.wants.edit": "**{tool}** 想要修改文件：",
        "approval.wants.tool": "**{tool}** 想要使用工具：",
        "approval.file_detail": "──── 以及它的改动或输入（{count} 个字符）────",
        "approval.expires": "等待回答至 {when}；届时无人回答即拒绝。",
        "approval.asked_of": "由 {name} 或 Hub 所有者回答。",
        "approval.allow_once": "允许一次",
        "approval.allow_session": "本对话内允许",
        "approval.deny": "拒绝",
        "approval.allowed_once": "{name} 允许了一次 · {when}",
        "approval.allowed_session": "{name} 在本对话内允许 · {when}",
        "approval.allowed_rule": "按本对话的规则允许 · {when}",
        "approval.denied_person": "{name} 已拒绝 · {when}",
        "approval.denied_timeout": "已拒绝：无人及时回答 · {when}",
        "approval.lapsed": "已失效：该轮次被交回队列，重新运行时会再次请求 · {when}",
        "approval.unanswered": "未回答",
        "approval.reason": "理由：{reason}",
        "approval.someone": "某人",
        "approval.more": "另有 {count} 个更早的请求未显示。",
        "approval.more_pending": "另有 {count} 个请求在等待；上面的回答后会依次显示在这里。",
        "approval.subject_in_file": (
            "内容过长（{count} 个字符），卡片放不下：完整内容在本话题中的文件 {name} 里，"
            "请先阅读再作答。"
        ),
        "approval.subject_unseen": (
            "内容过长（{count} 个字符），且无法发送含完整内容的文件：这里只能拒绝。"
        ),
        "approval.subject_cut": "内容过长（{count} 个字符），卡片只显示开头部分。",
        "approval.toast.allow_once": "已允许一次",
        "approval.toast.allow_session": "已在本对话内允许",
        "approval.toast.deny": "已拒绝",
        "approval.toast.not_yours": "只有本轮次的发起人或 Hub 所有者可以回答此请求。",
        "approval.toast.answered": "已被回答：{outcome}",
        "approval.toast.gone": "找不到这个请求了。",
        "progress.approval.asked": "等待授权：{request}（请在下方卡片中回答）",
        "progress.approval.settled": "{request}：{outcome}",
        "result.approvals": "**权限**",
        "result.approvals.rules": "本对话内已允许：{rules}",
        "manage.agents": "**Agent 权限**：Agent 无需询问即可做什么",
        "manage.permissions": "策略：**{policy}**",
        "manage.permissions.ask": "询问",
        "manage.permissions.auto": "自动",
        "manage.permissions.read-only": "只读",
        "manage.permissions.explain": (
            "询问：修改文件和会改变内容的命令需在聊天中获得回答。自动：沙箱内的一切操作直接运行。"
            "只读：工作区不能被修改。"
        ),
        "manage.approval_timeout": "**授权超时**：无人回答的请求在 **{timeout}** 后被拒绝",
        "manage.budget.daily": "**每人每日 token**（UTC）：**{tokens}**",
        "manage.budget.turn": "**每轮 token**：**{tokens}**",
        "manage.live": "这些设置立即保存，对修改之后开始的轮次生效，无需重启。",
        "value.seconds": "{seconds} 秒",
        "value.minutes": "{minutes} 分钟",
        "value.hours": "{hours} 小时",
        "error.title": "出错了",
        "error.code": "错误码 `{code}`",
        "error.detail": "详情：{message}",
        "error.about.agent_protocol": "Agent 程序的回应方式 amux 无法识别。",
        "error.about.binding_mismatch": "此对话的记忆现在属于另一个范围：请开始新的对话。",
        "error.about.conflict": "内容已被修改：请重新打开后再试。",
        "error.about.executable_missing": "工作节点上没有安装该 Agent 程序。",
        "error.about.executable_unreachable": "Agent 程序所在的目录不允许 Agent 的用户进入。",
        "error.about.feishu_api_error": "飞书拒绝了这个请求。",
        "error.about.forbidden": "你无权执行此操作。",
        "error.about.internal": "amux 发生了意外错误；所有者可在日志中查看原因。",
        "error.about.invalid_argument": "无法理解这个请求。",
        "error.about.invalid_path": "这不是有效的记忆路径。",
        "error.about.feishu_not_connected": (
            "飞书文档只以你自己的账号读取，而你尚未连接：请在与机器人的私聊中发送 /amux connect。"
        ),
        "error.about.feishu_refused": "飞书没有把这份文档交给你的账号。",
        "error.about.feishu_unavailable": "此 Hub 暂时无法访问飞书。",
        "error.about.memory_disabled": "本 Hub 未开启 Agent 记忆。",
        "error.about.native_memory_unconfirmed": "无法关闭 Agent 自带的记忆，因此没有启动它。",
        "error.about.not_found": "找不到它（或已不存在）。",
        "error.about.payload_too_large": "内容过大。",
        "error.about.quota_exceeded": "已达到上限。",
        "error.about.sandbox_unavailable": "集群暂时没有为 Agent 提供沙箱：请稍后再试。",
        "error.about.request_timeout": "耗时过长。",
        "error.about.storage_unavailable": "amux 暂时无法写入存储。",
        "error.about.forge_unavailable": "项目的 GitHub 或 GitLab 拒绝了请求或没有应答。",
        "error.about.unauthenticated": "amux 无法确认你的身份。",
        "error.about.unavailable": "amux 或飞书暂时不可用：请稍后再试。",
        "error.about.unsupported_encoding": "文本的编码 amux 无法读取。",
        "warning.title": "提示",
        "notice.memory_disabled.title": "记忆不可用",
        "notice.memory_disabled": "本 Hub 未开启 Agent 记忆。所有者可在 /amux → 实验功能 中开启。",
        "notice.memory_disabled.erase_hint": "关闭期间你的记忆文档仍会保留。你仍可以将其彻底删除。",
        "notice.memory_disabled.erase": "彻底删除我的记忆…",
        "comment.long": "回答超出评论回复的长度：完整内容已发到你与机器人的私聊中。",
        "comment.cut": (
            "回答在此截断：其余内容无法发到你与机器人的私聊中。请与机器人开启私聊后再问一次。"
        ),
        "comment.title": "对你评论的回答",
        "comment.failed": "Agent 未能回答：{reason}",
        "comment.stopped": "这一轮在 Agent 回答前被停止了。",
        "comment.refused": "未运行：{reason}",
        "comment.empty": "请在 @ 之后写下你想让 Agent 做的事。",
        "comment.unreadable": "无法读取这条评论，因此未运行：{reason}",
        "comment.own_thread": (
            "这个评论串属于另一位成员的对话，且记忆按人隔离。请新建你自己的评论与 Agent 对话。"
        ),
        "notice.enrollment_closed.title": "尚未加入",
        "notice.enrollment_closed": "本 Hub 目前不接受新成员。请联系所有者添加你。",
        "notice.own_topic.title": "请开启你自己的话题",
        "notice.own_topic": (
            "这个话题属于另一位成员，且记忆按人隔离。请新建你自己的话题与助手对话。"
        ),
        "notice.owner_only.title": "仅限所有者",
        "notice.owner_only": "只有本 Hub 的所有者可以修改设置。",
        "notice.owner_only.toast": "只有本 Hub 的所有者可以执行此操作。",
        "notice.project_memory": (
            "本群共享项目 **{project}** 的记忆：只有本 Hub 的所有者可以通过卡片修改或删除它。"
            "本群的轮次仍可读取和保存它。"
        ),
        "notice.stale_card": "此卡片已过期，请重新打开 /amux。",
        "notice.try_later.title": "请稍后再试",
        "notice.try_later.messages": (
            "你一分钟内发送的消息超过了 {limit} 条，这是每人的上限。请在 {seconds} 秒后再试；"
            "在此之前的新消息不会得到回复。"
        ),
        "notice.try_later.queued": (
            "你已有 {limit} 个轮次在等待空闲的 Agent 位置，这是每人可排队的上限。"
            "请在约 {seconds} 秒后再试，届时其中一个应已开始运行。"
        ),
    },
}


def text(lang: Lang, key: str, **fields: Any) -> str:
    """The catalogue string ``key`` in ``lang`` with ``fields`` filled in.

    Raises:
        KeyError: ``key`` is not in the catalogue (a programming error, caught by tests).
    """
    template = MESSAGES[lang][key]
    return template.format(**fields) if fields else template


def plain_text(lang: Lang, key: str, **fields: Any) -> str:
    """``text`` for a plain-text message, which Feishu shows as typed: the template's Markdown
    markers go (a name in ``**`` would show its asterisks); the fields stay as they are."""
    template = _MARKUP.sub("", MESSAGES[lang][key])
    return template.format(**fields) if fields else template


def about_error(lang: Lang, code: str) -> str | None:
    """What the stable error ``code`` means, in ``lang``; None for a code the catalogue does not
    know (a turn's own failure words)."""
    return MESSAGES[lang].get(f"error.about.{code}")
