"""User-assistant dialogue simulation (paper §3.1 and App. B.4, Fig. 19).

Each round: the assistant simulator answers (the paper's system prompt: at most 6 sentences); the
user simulator judges the answer on every checklist item (yes/no, one short request per item); the
score is 10 when every item is met, else 1 + 9 * met // n (at most 9). Below 10 the user sends
indirect feedback on ONE unmet item, preferring one not mentioned before; at 10 the user sends a
closing message that alludes to every item not mentioned yet, and the dialogue ends. The turn cap
(`max_turns` assistant replies) ends it otherwise, on the user's last feedback.

The paper asks one model call for evaluation, score, item selection and message together; here code
keeps the bookkeeping (which item, which items are still unmentioned) so that the rules hold even
with a model that cannot follow them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from cupid.eval.benchmark.data import Message
from cupid.matcher import prompts, schemas
from cupid.training.synth.ask import Asker, all_of
from cupid.training.synth.parse import Unusable, echoes, free_text, normalized, words, yes_no

MIN_MESSAGE_WORDS = 3


class Turn(BaseModel):
    """One round after an assistant reply: the verdicts, the score and what the user's message covers."""

    model_config = ConfigDict(extra="forbid")
    verdicts: list[bool]
    score: int
    kind: Literal["feedback", "closing"]
    items: list[int]  # 0-based checklist items the message alludes to


def score(verdicts: list[bool]) -> int:
    met = sum(verdicts)
    return 10 if met == len(verdicts) else 1 + (9 * met) // len(verdicts)


def pick_unmet(verdicts: list[bool], mentioned: set[int]) -> int:
    unmet = [i for i, ok in enumerate(verdicts) if not ok]
    return next((i for i in unmet if i not in mentioned), unmet[0])


def transcript(dialogue: list[Message]) -> str:
    return "\n\n".join(f"{'User' if m.role == 'user' else 'Assistant'}: {m.content}" for m in dialogue)


def reply_shape(chars: int) -> str:
    """The assistant: one paragraph without headings or lists; its length is the cap, which stands for the
    system prompt's "at most 6 sentences" (a regex that counted sentences too would split the cap six ways
    and hold a reply of one long sentence to a sixth of it)."""
    return schemas.paragraph(chars)


def judge_shape(chars: int) -> str:
    """One checklist item's verdict: the single word the prompt asks for."""
    return "(Yes|No)"


def message_shape(chars: int) -> str:
    """The user's feedback or closing message: one short paragraph without markup (short: the cap)."""
    return schemas.paragraph(chars, least=MIN_MESSAGE_WORDS * 3)


def read_reply(answer: str) -> str:
    text = answer.strip()
    if not words(text):
        raise Unusable("the answer is empty")
    return text


def read_message(conversation: str, items: list[str]):
    def read(answer: str) -> str:
        text = free_text(answer, prefixes=("message", "user", "your message"))
        if len(words(text)) < MIN_MESSAGE_WORDS:
            raise Unusable(f"the message needs at least {MIN_MESSAGE_WORDS} words")
        if any(normalized(item) in normalized(text) for item in items):
            raise Unusable("the message quotes the checklist; hint at the point in your own words")
        if echoes(text, conversation, share=0.8):
            raise Unusable("the message repeats the conversation; write the user's new message")
        return text

    return read


async def simulate(
    asker: Asker, persona: str, position: int, factor: str, request: str, checklist: list[str]
) -> tuple[list[Message], list[Turn], str]:
    """The dialogue, its rounds, and how it ended: `satisfied` or `turn_cap`."""
    cfg = asker.cfg
    dialogue = [Message(role="user", content=request)]
    turns: list[Turn] = []
    mentioned: set[int] = set()
    system = prompts.load("synth_assistant_simulator").system
    for turn in range(1, cfg.max_turns + 1):
        step = f"dialogue[{position}].turn[{turn}]"
        chat = [{"role": "system", "content": system}] + [m.model_dump() for m in dialogue]
        reply = await asker.ask(
            f"{step}.assistant", "assistant_simulator", chat, read_reply, cfg.max_tokens.assistant, reply_shape
        )
        dialogue.append(Message(role="assistant", content=reply))
        verdicts = list(
            await all_of(
                *(
                    asker.ask(
                        f"{step}.judge[{i}]",
                        "user_simulator",
                        prompts.load("project_synth_judge").render(request=request, response=reply, item=item),
                        yes_no,
                        cfg.max_tokens.judge,
                        judge_shape,
                    )
                    for i, item in enumerate(checklist)
                )
            )
        )
        conversation = transcript(dialogue)
        if all(verdicts):
            items = [i for i in range(len(checklist)) if i not in mentioned] or list(range(len(checklist)))
            msgs = prompts.load("project_synth_closing").render(
                persona=persona,
                factor=factor,
                conversation=conversation,
                items="\n".join(f"- {checklist[i]}" for i in items),
            )
            kind: Literal["feedback", "closing"] = "closing"
        else:
            items = [pick_unmet(verdicts, mentioned)]
            msgs = prompts.load("project_synth_feedback").render(
                persona=persona, factor=factor, conversation=conversation, item=checklist[items[0]]
            )
            kind = "feedback"
        read = read_message(conversation, [checklist[i] for i in items])
        message = await asker.ask(f"{step}.{kind}", "user_simulator", msgs, read, cfg.max_tokens.message, message_shape)
        dialogue.append(Message(role="user", content=message))
        mentioned.update(items)
        turns.append(Turn(verdicts=verdicts, score=score(verdicts), kind=kind, items=items))
        if kind == "closing":
            return dialogue, turns, "satisfied"
    return dialogue, turns, "turn_cap"
