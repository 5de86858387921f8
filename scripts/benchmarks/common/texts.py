"""A fixed, seeded set of English sentences, so every system embeds the same inputs (no downloads)."""

from __future__ import annotations

import random

WORDS = """
the of and to in is that it was for on are with as his they be at one have this from or had by
word but what some we can out other were all there when up use your how said an each she which do
their time if will way about many then them write would like so these her long make thing see him
two has look more day could go come did number sound no most people my over know water than call
first who may down side been now find any new work part take get place made live where after back
little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too
same tell does set three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four between state
keep eye never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children begin
got walk example ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain stop once base
hear horse cut sure watch color face wood main enough plain girl usual young ready above ever red
list though feel talk bird soon body dog family direct pose leave song measure door product black
short numeral class wind question happen complete ship area half rock order fire south problem
piece told knew pass since top whole king space heard best hour better true during hundred five
remember step early hold west ground interest reach fast verb sing listen six table travel less
morning ten simple several vowel toward war lay against pattern slow center love person money serve
appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead
cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive
""".split()

SEED = 0
COUNT = 500
MIN_WORDS, MAX_WORDS = 5, 60


def sentences(count: int = COUNT, seed: int = SEED) -> list[str]:
    """``count`` sentences of 5 to 60 words, identical on every run and machine."""
    rng = random.Random(seed)
    result = []
    for _ in range(count):
        words = rng.choices(WORDS, k=rng.randint(MIN_WORDS, MAX_WORDS))
        result.append(" ".join(words).capitalize() + ".")
    return result


def shuffled(seed: int = SEED) -> list[str]:
    """The same sentences in a seeded random order, so batches mix short and long texts."""
    texts = sentences()
    random.Random(seed + 1).shuffle(texts)
    return texts
