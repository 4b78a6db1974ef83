"""The Agent Card: it names the agent and its offers and scheme; the agent's key signs it, and
nothing else verifies."""

from __future__ import annotations

import pytest
from a2a.utils.signing import SignatureVerificationError

from macula.agent.petnames import petname
from macula.wire.identity import Identity
from tools.a2a.card import agent_card, sign_card, verify_card

ADA, BOB = Identity(bytes(range(32))), Identity(bytes(range(1, 33)))


def test_the_card_names_the_agent_its_offers_and_its_scheme() -> None:
    card = agent_card("ada", ADA.node_id, "http://h/a2a/ada/", ["code review", "tests"], "ask")
    assert card.name == petname(ADA.node_id) and ADA.node_id.hex() in card.description
    assert [s.name for s in card.skills] == ["code review", "tests"]
    assert card.supported_interfaces[0].protocol_binding == "JSONRPC"
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert [s.id for s in agent_card("ada", ADA.node_id, "u", [], "closed").skills] == ["task"]


def test_only_the_agents_key_signs_its_card() -> None:
    card = agent_card("ada", ADA.node_id, "http://h/a2a/ada/", [], "ask")
    signed = sign_card(card, ADA)
    assert not card.signatures and len(signed.signatures) == 1
    verify_card(signed, ADA.node_id)
    assert sign_card(signed, ADA).signatures == signed.signatures  # deterministic, replaced
    with pytest.raises(SignatureVerificationError):
        verify_card(signed, BOB.node_id)
    with pytest.raises(SignatureVerificationError):
        verify_card(card, ADA.node_id)  # unsigned
    signed.skills[0].name = "something else"
    with pytest.raises(SignatureVerificationError):
        verify_card(signed, ADA.node_id)
