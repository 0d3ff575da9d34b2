"""Prompt sets of the evaluation command (lab/gpu/evaluate.py), written for it.

grounded: the answer repeats much of the prompt (code edits that return the whole code, format
          conversions, fixing a text, log reformatting): n-gram drafts taken from the prompt can
          match.
open:     stories and explanations: little of the answer is in the prompt.
Each prompt has a stable id (set-index), which pairs the requests of two servers.
"""

GROUNDED = [
    # code edits that return the code
    "Rename the variable `tmp` to `total` in this Python function and return the whole function, "
    "nothing else:\n\n"
    "def sum_prices(items):\n"
    "    tmp = 0\n"
    "    for item in items:\n"
    "        if item.price > 0:\n"
    "            tmp += item.price * item.quantity\n"
    "    return tmp\n",
    "Add type hints to this Python function and return the complete code:\n\n"
    "def merge_counts(a, b):\n"
    "    result = dict(a)\n"
    "    for key, value in b.items():\n"
    "        result[key] = result.get(key, 0) + value\n"
    "    return result\n\n"
    "def top_keys(counts, n):\n"
    "    return sorted(counts, key=counts.get, reverse=True)[:n]\n",
    "Replace the for loop with a list comprehension and return the full file:\n\n"
    "import math\n\n"
    "def squares_of_odd(numbers):\n"
    "    out = []\n"
    "    for x in numbers:\n"
    "        if x % 2 == 1:\n"
    "            out.append(x * x)\n"
    "    return out\n\n"
    "def norms(vectors):\n"
    "    return [math.sqrt(sum(v * v for v in vec)) for vec in vectors]\n",
    # format conversions
    "Convert this CSV into a JSON array of objects, one object per row:\n\n"
    "name,city,age\n"
    "Anna,Lisbon,34\n"
    "Bruno,Porto,29\n"
    "Carla,Braga,41\n"
    "Diego,Faro,25\n"
    "Elena,Coimbra,38\n",
    "Convert this JSON to YAML and return only the YAML:\n\n"
    '{"server": {"host": "0.0.0.0", "port": 8080, "workers": 4},\n'
    ' "database": {"url": "postgres://db:5432/app", "pool_size": 10, "timeout_s": 30},\n'
    ' "logging": {"level": "info", "file": "/var/log/app.log"}}\n',
    # fixing a text
    "Fix the spelling and grammar mistakes in this paragraph and return the corrected "
    "paragraph:\n\n"
    "Yesterday we was going to the libary to returne the books we borowed last month. The weather "
    "were nice, so we desided to walk insted of taking the bus. On the way we meet our neighbour, "
    "who tell us that the libary is closed on mondays.\n",
    "Correct the punctuation and capitalisation of this note and return it:\n\n"
    "dear mr brown\n"
    "thank you for your letter of march 3 we have received the invoice and will pay it by the end "
    "of the month if you have any questions please call our office on monday or tuesday\n"
    "best regards\n"
    "sarah lee\n",
    # log reformatting
    "Reformat each log line as `TIME | LEVEL | MESSAGE` and return all the lines:\n\n"
    "[2024-05-01 10:00:01] INFO server started on port 8080\n"
    "[2024-05-01 10:00:05] WARN cache miss for key user:42\n"
    "[2024-05-01 10:00:09] INFO request GET /api/items took 12 ms\n"
    "[2024-05-01 10:00:12] ERROR database timeout after 30 s\n"
    "[2024-05-01 10:00:15] INFO request POST /api/items took 48 ms\n"
    "[2024-05-01 10:00:20] INFO server stopped\n",
]

OPEN = [
    "Write a short story about a clockmaker who builds a clock that runs backwards.",
    "Explain how a vaccine teaches the immune system to recognise a virus.",
    "Write a story about a robot that tends a garden on the roof of a city building.",
    "Explain why the Earth has seasons, for someone who has never studied astronomy.",
    "Describe a journey by night train through the mountains, in the first person.",
    "Explain what a hash table is and why looking up a key in it is fast.",
]

SETS = {"grounded": GROUNDED, "open": OPEN}


def build(sets, per_set):
    """[{'id', 'set', 'text'}] for the named sets, at most per_set prompts of each, in order."""
    out = []
    for name in sets:
        if name not in SETS:
            raise ValueError(f"unknown prompt set {name!r}; allowed: {', '.join(SETS)}")
        for i, text in enumerate(SETS[name][:per_set]):
            out.append({"id": f"{name}-{i}", "set": name, "text": text})
    return out
