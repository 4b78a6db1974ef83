"""Petnames: a stable, human-legible label for a node id, and resolving one back to a node id.

Invariants:
- ``petname(node_id)`` is ``<first>_<second>_<noun>_<NNNN>``: three words picked from the three
  256-word lists below and four decimal digits, all read from SHA-256(node_id). It never changes
  for a node id and needs nothing but the node id.
- The bytes are read from the *end* of the digest: the identity puzzle (PROTOCOL.md §12.2)
  zeroes the *leading* bits of this same SHA-256, so its first bytes are nearly constant.
- A petname is a label, never an identity: it can collide (1 in 256³·10⁴). Resolution happens
  only against the caller's own roster and refuses zero or several matches, naming candidates;
  it never guesses.
- The word lists are part of the output format: changing, reordering or adding a word renames
  every agent. Words are lowercase ASCII letters only, so ``_`` separates them unambiguously.
No I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Final

from macula.errors import MaculaError


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


FIRST_WORDS: Final[tuple[str, ...]] = _words(
    """
    adept agile alert amiable amused ardent astute avid blithe bold brave breezy bright brisk
    buoyant calm candid capable careful caring cheerful cheery chipper civil clever comic
    cordial cosmic crafty curious daring dapper dashing decent deft devoted diligent direct
    discreet dreamy dutiful eager earnest easy elated eloquent epic exact expert fabled fair
    faithful fancy fearless feisty fervent festive fiery fine fluent focused fond frank free
    friendly frisky gallant game generous genial gentle genuine giddy gifted glad gleeful
    glowing good graceful gracious grand grateful gutsy handy happy hardy hearty helpful heroic
    honest hopeful humble jaunty jolly jovial joyful jubilant just keen kind kindly likable
    lively logical loyal lucid lucky magic majestic merry mellow mighty mindful modest neat
    nimble noble patient peaceful peppy perky placid playful pleasant plucky poised polite
    precise proud prudent punctual quick quiet quirky radiant rapid rational ready regal relaxed
    reliable resolute robust rugged sage sane savvy serene sharp shrewd sincere skilled sleek
    smart snappy snug sociable solid sound sparkling spirited spry stable stalwart staunch
    steady sterling stoic sturdy suave sunny super supreme sure swift tactful talented tender
    thankful thoughtful thrifty tidy tireless tolerant tranquil trusty truthful upbeat valiant
    vibrant vigilant vivid warm wary whimsical wise witty worthy zany zealous zesty amazing
    awesome blissful bouncy charming chummy classy cozy cuddly dainty dazzling delightful
    dynamic elegant enchanted energetic excited fabulous famous glorious groovy humorous ideal
    inventive jazzy joyous kindred laughing learned lovely marvelous nifty nice optimistic
    orderly outgoing passionate perfect pleased positive princely quaint rare refined
    resourceful respectful scholarly sensible smiling soothing sparkly splendid spunky stellar
    strong
    """
)
SECOND_WORDS: Final[tuple[str, ...]] = _words(
    """
    amber azure coral crimson cobalt cyan emerald golden indigo ivory jade lavender lilac lime
    magenta maroon mauve minty navy ochre olive orchid peach pearly pink plum ruby rusty saffron
    sandy scarlet sepia silver teal topaz turquoise violet blue green purple copper bronze
    creamy fluffy fuzzy furry silky velvet woolly glossy shiny smooth crisp crunchy bumpy knobby
    spotted striped dotted speckled checkered dappled freckled frosty snowy sunlit rainy misty
    foggy stormy windy cloudy dewy balmy wintry vernal autumn summery starry moonlit lunar solar
    polar arctic tropical alpine coastal rustic rural northern southern eastern western tiny
    small little big giant huge jumbo mini petite tall long lanky round square oval curly wavy
    spiky pointy hollow ancient antique early modern young vintage classic royal velvety woven
    wooden marble crystal glassy silvery hushed humming buzzing chirpy whistling rumbling
    echoing singing dancing drifting floating flying gliding hopping jumping leaping racing
    roaming rolling running sailing skipping soaring spinning swimming swirling trotting
    wandering waving wiggly wobbly zigzag twinkling glimmering shimmering blazing bubbly fizzy
    frothy foamy peppery salty sugary spicy tangy fruity nutty lemony honeyed buttery toasty
    crusty fresh ripe leafy grassy mossy woody flowery floral blooming budding sprouting verdant
    lush wild shady dusky angular circular curved cubic conical spiral tidal oceanic rocky
    pebbly dusty muddy icy frozen electric magnetic atomic sonic quantum galactic orbital double
    triple single twin prime hidden mystic hazy pale deep shallow wide narrow steep flat level
    open satin linen cotton denim tweed paisley plaid tartan distant nearby upper lower inner
    outer middle central coppery smoky sunset morning evening midnight
    """
)
NOUNS: Final[tuple[str, ...]] = _words(
    """
    aardvark albatross alpaca ant anteater antelope armadillo badger bear beaver bee beetle
    bison bluebird boar bobcat buffalo bumblebee butterfly camel canary capybara cardinal
    caribou cat catfish cheetah chickadee chinchilla chipmunk cicada clam cockatoo condor
    cormorant cougar coyote crab crane cricket crow cuckoo deer dingo dolphin donkey dove
    dragonfly duck eagle eel egret elephant elk emu falcon ferret finch firefly flamingo fox
    frog gazelle gecko gerbil gibbon giraffe gnu goat goldfish goose gopher gorilla grasshopper
    grouse gull hamster hare hawk hedgehog heron hippo hornet horse hummingbird ibex ibis iguana
    impala jackal jaguar jay jellyfish kangaroo kingfisher kitten kiwi koala kookaburra ladybug
    lark lemming lemur leopard lion lizard llama lobster lynx macaw magpie manatee mantis marmot
    marten meerkat mink mole mongoose moose moth mouse mule narwhal newt nightingale ocelot
    octopus okapi opossum orca oriole oryx osprey ostrich otter owl ox oyster panda panther
    parrot partridge peacock pelican penguin pheasant pigeon pika platypus pony porcupine
    porpoise puffin puma quail quokka rabbit raccoon ram raven reindeer robin salamander salmon
    sandpiper sardine seahorse seal shark sheep shrew shrimp skylark sloth snail sparrow squid
    squirrel starfish stingray stork swallow swan tapir tarsier tern tiger toad toucan trout
    tuna turkey turtle urchin vole wallaby walrus warbler weasel whale wildcat wolf wombat
    woodpecker wren yak zebra acorn aspen birch blossom boulder breeze brook canyon cedar cliff
    clover cloud comet cosmos cove creek daisy delta dune ember fern fjord forest galaxy geyser
    glacier grove harbor hazel heather hill island ivy lagoon lake lantern laurel lily lotus
    maple meadow mesa meteor moon moss nebula oak oasis
    """
)

NODE_ID_SIZE: Final = 32
_HEX64: Final = re.compile(r"[0-9a-fA-F]{64}")
_HEXISH: Final = re.compile(r"[0-9a-fA-F]+")
_MAX_SUGGESTIONS: Final = 5
_MIN_SHARED_PREFIX: Final = 3


class PetnameError(MaculaError, ValueError):
    """A name or node id did not resolve; ``candidates`` names what the caller may have meant.

    For zero matches the candidates are roster petnames sharing the longest prefix with the
    input; for several matches they are the 64-hex node ids that all carry that petname.
    """

    def __init__(self, message: str, candidates: Iterable[str] = ()) -> None:
        self.candidates: tuple[str, ...] = tuple(candidates)
        super().__init__(message)


def petname(node_id: bytes) -> str:
    """The stable petname of a 32-byte node id, e.g. ``upbeat_mossy_otter_0421``."""
    if type(node_id) is not bytes or len(node_id) != NODE_ID_SIZE:
        raise PetnameError("a node id is exactly 32 bytes")
    digest = hashlib.sha256(node_id).digest()
    number = int.from_bytes(digest[-7:-3], "big") % 10_000
    return f"{FIRST_WORDS[digest[-1]]}_{SECOND_WORDS[digest[-2]]}_{NOUNS[digest[-3]]}_{number:04d}"


def parse_node_hex(text: str) -> bytes | None:
    """The node id a 64-hex string (any case, surrounding blanks ignored) names, else None."""
    candidate = text.strip()
    if _HEX64.fullmatch(candidate) is None:
        return None
    return bytes.fromhex(candidate)


def resolve(name_or_hex: str, roster_node_ids: Iterable[bytes]) -> bytes:
    """The node id named by a 64-hex string or by a petname seen in ``roster_node_ids``.

    A 64-hex string is returned as bytes whether or not the roster knows it. A petname
    (case-insensitive) must belong to exactly one node id of the roster; otherwise
    ``PetnameError`` names the candidates. Roster entries that are not 32 bytes are ignored,
    and a node id listed twice counts once.
    """
    if type(name_or_hex) is not str:
        raise PetnameError("expected a 64-hex node id or a petname")
    direct = parse_node_hex(name_or_hex)
    if direct is not None:
        return direct
    wanted = name_or_hex.strip().lower()
    if not wanted:
        raise PetnameError("expected a 64-hex node id or a petname, got an empty string")
    if _HEXISH.fullmatch(wanted):
        raise PetnameError(
            f"{wanted!r} looks like a node id but has {len(wanted)} hex characters, not 64"
        )
    names = {
        node_id: petname(node_id)
        for node_id in roster_node_ids
        if type(node_id) is bytes and len(node_id) == NODE_ID_SIZE
    }
    matches = sorted(node_id.hex() for node_id, name in names.items() if name == wanted)
    if len(matches) == 1:
        return bytes.fromhex(matches[0])
    if matches:
        raise PetnameError(
            f"petname {wanted!r} belongs to {len(matches)} agents in your roster "
            f"(a collision); use one of their node ids: {', '.join(matches)}",
            matches,
        )
    suggestions = _similar(wanted, names.values())
    hint = f"; did you mean: {', '.join(suggestions)}" if suggestions else ""
    raise PetnameError(
        f"no agent in your roster is called {wanted!r} (petnames resolve only against agents "
        f"you have seen){hint}",
        suggestions,
    )


def _similar(wanted: str, names: Iterable[str]) -> list[str]:
    """Roster petnames sharing the longest prefix (at least 3 characters) with ``wanted``."""
    scored = [(_shared_prefix(wanted, name), name) for name in set(names)]
    best = max((score for score, _ in scored), default=0)
    if best < _MIN_SHARED_PREFIX:
        return []
    return sorted(name for score, name in scored if score == best)[:_MAX_SUGGESTIONS]


def _shared_prefix(a: str, b: str) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count
