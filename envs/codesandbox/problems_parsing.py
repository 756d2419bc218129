"""Problems about dicts and parsing: reading small formats and reshaping mappings."""

from __future__ import annotations

from agentrl.envs.codesandbox.problem import Problem, Raises, problem

PROBLEMS: tuple[Problem, ...] = (
    problem(
        "parse_settings",
        "easy",
        "def parse_settings(text: str) -> dict[str, str]:",
        """Parse settings written as `key=value` pairs separated by semicolons. Strip spaces
        around keys and values; skip empty pieces and pieces without '='; split each piece at its
        first '=' only (values may contain '='); a key given twice keeps its last value.""",
        [
            (("a=1; b = two;c=3",), {"a": "1", "b": "two", "c": "3"}),
            (("",), {}),
            (("x=1;x=2",), {"x": "2"}),
            (("url=http://h/?q=1 ; junk ;;",), {"url": "http://h/?q=1"}),
            (("empty= ;k=v",), {"empty": "", "k": "v"}),
            ((" spaced key = spaced value ",), {"spaced key": "spaced value"}),
        ],
        """
        def parse_settings(text: str) -> dict[str, str]:
            settings = {}
            for piece in text.split(";"):
                if "=" not in piece:
                    continue
                key, value = piece.split("=", 1)
                settings[key.strip()] = value.strip()
            return settings
        """,
        # Splits at every '=' and keeps only the second part of the value.
        """
        def parse_settings(text: str) -> dict[str, str]:
            settings = {}
            for piece in text.split(";"):
                parts = piece.split("=")
                if len(parts) < 2:
                    continue
                settings[parts[0].strip()] = parts[1].strip()
            return settings
        """,
    ),
    problem(
        "invert_mapping",
        "easy",
        "def invert_mapping(mapping: dict[str, str]) -> dict[str, list[str]]:",
        """Invert a mapping: for each value, list the keys that map to it, sorted
        alphabetically.""",
        [
            (({"a": "x", "b": "y", "c": "x"},), {"x": ["a", "c"], "y": ["b"]}),
            (({},), {}),
            (({"z": "1", "y": "1", "x": "1"},), {"1": ["x", "y", "z"]}),
            (({"k": "v"},), {"v": ["k"]}),
        ],
        """
        def invert_mapping(mapping: dict[str, str]) -> dict[str, list[str]]:
            inverted: dict[str, list[str]] = {}
            for key, value in mapping.items():
                inverted.setdefault(value, []).append(key)
            return {value: sorted(keys) for value, keys in inverted.items()}
        """,
        # Keeps the keys in the mapping's order rather than sorting them.
        """
        def invert_mapping(mapping: dict[str, str]) -> dict[str, list[str]]:
            inverted: dict[str, list[str]] = {}
            for key, value in mapping.items():
                inverted.setdefault(value, []).append(key)
            return inverted
        """,
    ),
    problem(
        "sum_counts",
        "easy",
        "def sum_counts(counters: list[dict[str, int]]) -> dict[str, int]:",
        """Add up several dicts of counts key by key. Keys whose total is 0 are left out of the
        result.""",
        [
            (([{"a": 1, "b": 2}, {"b": 3, "c": 1}],), {"a": 1, "b": 5, "c": 1}),
            (([],), {}),
            (([{"a": 2}, {"a": -2, "b": 1}],), {"b": 1}),
            (([{"x": 0}],), {}),
            (([{"n": -3}, {"n": 1}],), {"n": -2}),
        ],
        """
        def sum_counts(counters: list[dict[str, int]]) -> dict[str, int]:
            total: dict[str, int] = {}
            for counter in counters:
                for key, n in counter.items():
                    total[key] = total.get(key, 0) + n
            return {k: v for k, v in total.items() if v != 0}
        """,
        # collections.Counter's `+` also drops negative totals.
        """
        from collections import Counter

        def sum_counts(counters: list[dict[str, int]]) -> dict[str, int]:
            total = Counter()
            for counter in counters:
                total = total + Counter(counter)
            return dict(total)
        """,
    ),
    problem(
        "parse_duration",
        "medium",
        "def parse_duration(text: str) -> int:",
        """Turn a duration such as "1h30m", "45s" or "2h 5s" into seconds. It is a sequence of
        parts, each a whole number followed by a unit d, h, m or s (days, hours, minutes,
        seconds), with optional spaces between parts; each unit at most once, in the order d, h,
        m, s. Raise ValueError for anything else, including an empty string.""",
        [
            (("1h30m",), 5400),
            (("45s",), 45),
            (("2h 5s",), 7205),
            (("",), Raises("ValueError")),
            (("1d",), 86400),
            (("3m2h",), Raises("ValueError")),
            (("10x",), Raises("ValueError")),
            (("1h1h",), Raises("ValueError")),
            (("0d 0h 0m 7s",), 7),
            (("h",), Raises("ValueError")),
        ],
        """
        import re

        def parse_duration(text: str) -> int:
            match = re.fullmatch(r"\\s*(?:(\\d+)d)?\\s*(?:(\\d+)h)?\\s*(?:(\\d+)m)?\\s*(?:(\\d+)s)?\\s*", text)
            if not match or not any(match.groups()):
                raise ValueError(f"not a duration: {text!r}")
            d, h, m, s = (int(g) if g else 0 for g in match.groups())
            return ((d * 24 + h) * 60 + m) * 60 + s
        """,
        # Accepts the units in any order and any number of times.
        """
        import re

        def parse_duration(text: str) -> int:
            parts = re.findall(r"(\\d+)\\s*([dhms])", text)
            if not parts:
                raise ValueError(f"not a duration: {text!r}")
            seconds = {"d": 86400, "h": 3600, "m": 60, "s": 1}
            return sum(int(n) * seconds[u] for n, u in parts)
        """,
    ),
    problem(
        "eval_rpn",
        "medium",
        "def eval_rpn(tokens: list[str]) -> int:",
        """Evaluate an integer expression in reverse Polish notation, given as tokens: integers
        (possibly negative) and the operators + - * /. Division truncates toward zero (-7 / 2 is
        -3). The expression is valid and never divides by zero.""",
        [
            ((["2", "1", "+", "3", "*"],), 9),
            ((["4", "13", "5", "/", "+"],), 6),
            ((["-7", "2", "/"],), -3),
            ((["42"],), 42),
            ((["3", "-4", "-"],), 7),
            ((["7", "-2", "/", "5", "*"],), -15),
            ((["10", "6", "9", "3", "+", "-11", "*", "/", "*", "17", "+", "5", "+"],), 22),
        ],
        """
        def eval_rpn(tokens: list[str]) -> int:
            stack: list[int] = []
            for token in tokens:
                if token in ("+", "-", "*", "/"):
                    b, a = stack.pop(), stack.pop()
                    if token == "+":
                        stack.append(a + b)
                    elif token == "-":
                        stack.append(a - b)
                    elif token == "*":
                        stack.append(a * b)
                    else:
                        q = abs(a) // abs(b)
                        stack.append(q if (a >= 0) == (b >= 0) else -q)
                else:
                    stack.append(int(token))
            return stack[0]
        """,
        # Floor division rounds -7 / 2 down to -4.
        """
        def eval_rpn(tokens: list[str]) -> int:
            stack: list[int] = []
            ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a // b}
            for token in tokens:
                if token in ops:
                    b, a = stack.pop(), stack.pop()
                    stack.append(ops[token](a, b))
                else:
                    stack.append(int(token))
            return stack[0]
        """,
    ),
    problem(
        "split_csv_line",
        "hard",
        "def split_csv_line(line: str) -> list[str]:",
        """Split one line of CSV into its fields. Fields are separated by commas. A field may be
        quoted with double quotes, in which case it may contain commas, and a doubled double
        quote inside it stands for one double quote; the quotes themselves are not part of the
        field. Unquoted fields are taken as they are (spaces kept). An empty line is one empty
        field.""",
        [
            (("a,b,c",), ["a", "b", "c"]),
            (('x,"hello, world",y',), ["x", "hello, world", "y"]),
            (("",), [""]),
            (('"say ""hi""",2',), ['say "hi"', "2"]),
            ((",,",), ["", "", ""]),
            ((" a , b ",), [" a ", " b "]),
            (('"",""',), ["", ""]),
            (('one,"two,three",',), ["one", "two,three", ""]),
        ],
        """
        def split_csv_line(line: str) -> list[str]:
            fields, current, i, quoted = [], [], 0, False
            while i < len(line):
                c = line[i]
                if quoted:
                    if c == '"' and i + 1 < len(line) and line[i + 1] == '"':
                        current.append('"')
                        i += 1
                    elif c == '"':
                        quoted = False
                    else:
                        current.append(c)
                elif c == '"':
                    quoted = True
                elif c == ",":
                    fields.append("".join(current))
                    current = []
                else:
                    current.append(c)
                i += 1
            fields.append("".join(current))
            return fields
        """,
        # Drops the quote characters but never joins a doubled quote into one.
        """
        def split_csv_line(line: str) -> list[str]:
            fields, current, quoted = [], [], False
            for c in line:
                if c == '"':
                    quoted = not quoted
                elif c == "," and not quoted:
                    fields.append("".join(current))
                    current = []
                else:
                    current.append(c)
            fields.append("".join(current))
            return fields
        """,
    ),
    problem(
        "compare_versions",
        "medium",
        "def compare_versions(a: str, b: str) -> int:",
        """Compare two version strings made of non-negative integers joined by dots ("1.10.2").
        Compare part by part as numbers; a missing part counts as 0, so "1.0" equals "1".
        Return -1 if a is older, 1 if a is newer, 0 if they are equal.""",
        [
            (("1.10", "1.9"), 1),
            (("1.0", "1"), 0),
            (("0.9.9", "1.0"), -1),
            (("2.0.1", "2.0.1"), 0),
            (("3.01", "3.1"), 0),
            (("1.2", "1.2.0.1"), -1),
        ],
        """
        def compare_versions(a: str, b: str) -> int:
            pa = [int(x) for x in a.split(".")]
            pb = [int(x) for x in b.split(".")]
            n = max(len(pa), len(pb))
            pa += [0] * (n - len(pa))
            pb += [0] * (n - len(pb))
            return (pa > pb) - (pa < pb)
        """,
        # Compares the parts as text, so "10" sorts before "9".
        """
        def compare_versions(a: str, b: str) -> int:
            pa, pb = a.split("."), b.split(".")
            n = max(len(pa), len(pb))
            pa += ["0"] * (n - len(pa))
            pb += ["0"] * (n - len(pb))
            return (pa > pb) - (pa < pb)
        """,
    ),
    problem(
        "dig",
        "medium",
        "def dig(data: object, path: str, default: object = None) -> object:",
        """Look up a dotted path in nested dicts and lists: each part of the path is a dict key,
        or, when the current value is a list, a list index written in decimal (negative indexes
        count from the end). Return `default` if any step is missing or impossible. An empty path
        returns the data itself.""",
        [
            (({"a": {"b": [10, {"c": 42}]}}, "a.b.1.c"), 42),
            (({"a": 1}, "a.b"), None),
            (({"x": [1, 2, 3]}, "x.-1"), 3),
            (({"x": [1, 2, 3]}, "x.5", "none"), "none"),
            (({"k": {"0": "zero"}}, "k.0"), "zero"),
            (([5, 6], ""), [5, 6]),
            (({"a": [1]}, "a.first", 0), 0),
            (({"a": None}, "a"), None),
        ],
        """
        def dig(data: object, path: str, default: object = None) -> object:
            if path == "":
                return data
            current = data
            for part in path.split("."):
                if isinstance(current, dict):
                    if part not in current:
                        return default
                    current = current[part]
                elif isinstance(current, list):
                    try:
                        current = current[int(part)]
                    except (ValueError, IndexError):
                        return default
                else:
                    return default
            return current
        """,
        # Converts every digit-looking part to an int, even as a dict key.
        """
        def dig(data: object, path: str, default: object = None) -> object:
            if path == "":
                return data
            current = data
            for part in path.split("."):
                key = int(part) if part.lstrip("-").isdigit() else part
                try:
                    current = current[key]
                except (KeyError, IndexError, TypeError):
                    return default
            return current
        """,
    ),
    problem(
        "is_ipv4",
        "easy",
        "def is_ipv4(text: str) -> bool:",
        """Say whether the text is an IPv4 address in dotted decimal: exactly four parts
        separated by dots, each a decimal number from 0 to 255 written with ASCII digits only and
        without leading zeros ("0" is fine, "01" is not).""",
        [
            (("192.168.0.1",), True),
            (("256.1.1.1",), False),
            (("1.2.3",), False),
            (("01.2.3.4",), False),
            (("0.0.0.0",), True),
            (("1.2.3.4.",), False),
            (("1.2.-3.4",), False),
            (("255.255.255.255",), True),
            (("1.2.3.a",), False),
            ((" 1.2.3.4",), False),
        ],
        """
        def is_ipv4(text: str) -> bool:
            parts = text.split(".")
            if len(parts) != 4:
                return False
            for part in parts:
                if not part or not all("0" <= c <= "9" for c in part):
                    return False
                if len(part) > 1 and part[0] == "0":
                    return False
                if int(part) > 255:
                    return False
            return True
        """,
        # Allows leading zeros.
        """
        def is_ipv4(text: str) -> bool:
            parts = text.split(".")
            if len(parts) != 4:
                return False
            return all(p and all("0" <= c <= "9" for c in p) and int(p) <= 255 for p in parts)
        """,
    ),
    problem(
        "group_anagrams",
        "medium",
        "def group_anagrams(words: list[str]) -> list[list[str]]:",
        """Group words that are anagrams of each other (same letters, same counts, case
        sensitive). Sort the words inside each group alphabetically, keep repeated words, and
        sort the groups by their first word.""",
        [
            ((["eat", "tea", "tan", "ate", "nat", "bat"],), [["ate", "eat", "tea"], ["bat"], ["nat", "tan"]]),
            (([],), []),
            ((["a"],), [["a"]]),
            ((["ab", "ba", "ab"],), [["ab", "ab", "ba"]]),
            ((["Ab", "bA", "ba"],), [["Ab", "bA"], ["ba"]]),
        ],
        """
        def group_anagrams(words: list[str]) -> list[list[str]]:
            groups: dict[str, list[str]] = {}
            for word in words:
                groups.setdefault("".join(sorted(word)), []).append(word)
            return sorted(sorted(g) for g in groups.values())
        """,
        # Groups case-insensitively.
        """
        def group_anagrams(words: list[str]) -> list[list[str]]:
            groups: dict[str, list[str]] = {}
            for word in words:
                groups.setdefault("".join(sorted(word.lower())), []).append(word)
            return sorted(sorted(g) for g in groups.values())
        """,
    ),
    problem(
        "parse_query",
        "medium",
        "def parse_query(query: str) -> dict[str, list[str]]:",
        """Parse a URL query string such as "a=1&b=2&a=3" into a dict from each name to the list
        of its values in order. A '+' in a name or value means a space. A piece without '=' is a
        name with the value "" ; empty pieces are skipped. A leading '?' is ignored.""",
        [
            (("a=1&b=2&a=3",), {"a": ["1", "3"], "b": ["2"]}),
            (("?q=hello+world",), {"q": ["hello world"]}),
            (("",), {}),
            (("flag&x=1&&",), {"flag": [""], "x": ["1"]}),
            (("k=a=b",), {"k": ["a=b"]}),
            (("first+name=Ada&first+name=Grace",), {"first name": ["Ada", "Grace"]}),
        ],
        """
        def parse_query(query: str) -> dict[str, list[str]]:
            if query.startswith("?"):
                query = query[1:]
            result: dict[str, list[str]] = {}
            for piece in query.split("&"):
                if not piece:
                    continue
                name, _, value = piece.partition("=")
                result.setdefault(name.replace("+", " "), []).append(value.replace("+", " "))
            return result
        """,
        # A repeated name keeps only its last value.
        """
        def parse_query(query: str) -> dict[str, list[str]]:
            query = query.lstrip("?")
            result: dict[str, list[str]] = {}
            for piece in query.split("&"):
                if piece:
                    name, _, value = piece.partition("=")
                    result[name.replace("+", " ")] = [value.replace("+", " ")]
            return result
        """,
    ),
)
