"""The Agent Card of one hosted agent, and its signature.

- The card names the agent (its petname and node id), what it offers (its contact policy's
  ``offers``, one skill each, else one skill: take a task), the one interface (JSON-RPC, A2A
  1.0, at the door's ``/a2a/<agent>/``), streaming on, push off, and the one security scheme:
  HTTP bearer (a token from ``macula-mcp a2a-token create``).
- It is signed with the agent's own Ed25519 key, a JWS (RFC 7515, ``alg`` EdDSA, RFC 8037) over
  the card's RFC 8785 canonical form, as A2A 1.0 signs cards (the SDK's signer); the protected
  header's ``kid`` is the node id, which *is* the public key: anyone who knows the agent on the
  mesh can check the card with no other key or PKI (``verify_card``), and a card that verifies
  was made by the agent's key, wherever it is served from.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Final, cast

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT
from a2a.utils.signing import (
    ProtectedHeader,
    create_agent_card_signer,
    create_signature_verifier,
)
from jwt.api_jwk import PyJWK

from macula.agent.petnames import petname
from macula.wire.identity import Identity

SCHEME: Final = "bearer"
ALGORITHM: Final = "EdDSA"
VERSION: Final = "0.1.0"
MODES: Final = ["text/plain", "application/json"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def agent_card(
    name: str, node_id: bytes, url: str, offers: Sequence[str], policy: str
) -> AgentCard:
    """The unsigned card of agent ``name`` (node ``node_id``) served at ``url``."""
    pet = petname(node_id)
    skills = [
        AgentSkill(
            id=f"offer-{index}",
            name=offer[:80],
            description=f"{pet} offers: {offer}",
            tags=["macula", "offer"],
            input_modes=MODES,
            output_modes=MODES,
        )
        for index, offer in enumerate(offers)
    ] or [
        AgentSkill(
            id="task",
            name="take a task",
            description=f"hand {pet} a task; it answers with one outcome",
            tags=["macula", "task"],
        )
    ]
    return AgentCard(
        name=pet,
        description=(
            f"Mesh agent {pet} (macula node {node_id.hex()}, agent {name!r} of its home), "
            f"reached through its home's A2A door. A message becomes a mesh task handed to it; "
            f"its contact policy ({policy}) decides, as for any mesh sender."
        ),
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_CURRENT
            )
        ],
        version=VERSION,
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={
            SCHEME: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    bearer_format="a2a_ token",
                    description="made by the agent's owner: macula-mcp a2a-token create NAME "
                    f"--agent {name}",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={SCHEME: StringList()})],
        default_input_modes=MODES,
        default_output_modes=MODES,
        skills=skills,
    )


def _private_jwk(identity: Identity) -> PyJWK:
    return PyJWK(
        {
            "kty": "OKP",
            "crv": "Ed25519",
            "d": _b64(identity.seed),
            "x": _b64(identity.node_id),
        },
        algorithm=ALGORITHM,
    )


def public_jwk(node_id: bytes) -> PyJWK:
    """The verification key a node id stands for."""
    return PyJWK({"kty": "OKP", "crv": "Ed25519", "x": _b64(node_id)}, algorithm=ALGORITHM)


def sign_card(card: AgentCard, identity: Identity) -> AgentCard:
    """``card`` (a copy) with one signature by ``identity``, replacing any it had."""
    copy = AgentCard()
    copy.CopyFrom(card)
    del copy.signatures[:]
    signer = create_agent_card_signer(
        _private_jwk(identity),
        cast(ProtectedHeader, {"kid": identity.node_id.hex(), "alg": ALGORITHM, "typ": "JOSE"}),
    )
    return signer(copy)


def verify_card(card: AgentCard, node_id: bytes) -> None:
    """Raise ``a2a.utils.signing.SignatureVerificationError`` unless ``node_id`` signed ``card``."""

    def key(kid: str | None, jku: str | None) -> PyJWK:
        return public_jwk(node_id)

    create_signature_verifier(key, [ALGORITHM])(card)
