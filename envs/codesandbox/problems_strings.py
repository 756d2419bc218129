"""Problems about text: encoding, cleaning, comparing and reshaping strings."""

from __future__ import annotations

from agentrl.envs.codesandbox.problem import Problem, Raises, problem

PROBLEMS: tuple[Problem, ...] = (
    problem(
        "squeeze_runs",
        "easy",
        "def squeeze_runs(text: str) -> str:",
        """Run-length encode a string: write each run of a repeated character as the character
        followed by the run's length, but leave runs of length 1 as the bare character.""",
        [
            (("aaabcc",), "a3bc2"),
            (("",), ""),
            (("x",), "x"),
            (("zzzzzzzzzzzz",), "z12"),
            (("abab",), "abab"),
            (("  !!",), " 2!2"),
            (("aabbbaa",), "a2b3a2"),
        ],
        """
        def squeeze_runs(text: str) -> str:
            out = []
            i = 0
            while i < len(text):
                j = i
                while j < len(text) and text[j] == text[i]:
                    j += 1
                out.append(text[i] + (str(j - i) if j - i > 1 else ""))
                i = j
            return "".join(out)
        """,
        # Counts every character of a letter, not runs: merges separate runs.
        """
        from collections import Counter

        def squeeze_runs(text: str) -> str:
            return "".join(c + (str(n) if n > 1 else "") for c, n in Counter(text).items())
        """,
    ),
    problem(
        "is_loose_palindrome",
        "easy",
        "def is_loose_palindrome(text: str) -> bool:",
        """Say whether a sentence reads the same backwards once case is ignored and every
        character that is not a letter or a digit is dropped. An empty string (or one with no
        letters or digits) counts as a palindrome.""",
        [
            (("Never odd or even.",), True),
            (("Palindrome",), False),
            (("",), True),
            (("A man, a plan, a canal: Panama!",), True),
            (("No 'x' in Nixon",), True),
            (("12a21",), True),
            (("ab!ba?c",), False),
            ((".,;",), True),
        ],
        """
        def is_loose_palindrome(text: str) -> bool:
            kept = [c.lower() for c in text if c.isalnum()]
            return kept == kept[::-1]
        """,
        # Forgets to drop punctuation and spaces.
        """
        def is_loose_palindrome(text: str) -> bool:
            lowered = text.lower()
            return lowered == lowered[::-1]
        """,
    ),
    problem(
        "caesar_shift",
        "easy",
        "def caesar_shift(text: str, shift: int) -> str:",
        """Shift every ASCII letter of the text by `shift` places in the alphabet, wrapping around
        from z to a; keep each letter's case and leave every other character as it is. The shift
        may be negative or larger than 26.""",
        [
            (("Hello, World!", 3), "Khoor, Zruog!"),
            (("abc", -1), "zab"),
            (("", 5), ""),
            (("xyz XYZ", 29), "abc ABC"),
            (("Mixed 123 case", 0), "Mixed 123 case"),
            (("Zebra", -52), "Zebra"),
            (("ab-yz", 1), "bc-za"),
        ],
        """
        def caesar_shift(text: str, shift: int) -> str:
            out = []
            for c in text:
                if "a" <= c <= "z":
                    out.append(chr((ord(c) - 97 + shift) % 26 + 97))
                elif "A" <= c <= "Z":
                    out.append(chr((ord(c) - 65 + shift) % 26 + 65))
                else:
                    out.append(c)
            return "".join(out)
        """,
        # Lower-cases everything before shifting.
        """
        def caesar_shift(text: str, shift: int) -> str:
            out = []
            for c in text.lower():
                if "a" <= c <= "z":
                    out.append(chr((ord(c) - 97 + shift) % 26 + 97))
                else:
                    out.append(c)
            return "".join(out)
        """,
    ),
    problem(
        "word_counts",
        "medium",
        "def word_counts(text: str) -> dict[str, int]:",
        """Count the words of a text. A word is a maximal run of ASCII letters and apostrophes;
        words are counted case-insensitively and reported in lower case. Apostrophes at the start
        or end of a word are not part of it, and a run of apostrophes alone is not a word.""",
        [
            (("The cat and the hat.",), {"the": 2, "cat": 1, "and": 1, "hat": 1}),
            (("",), {}),
            (("Don't stop, don't!",), {"don't": 2, "stop": 1}),
            (("'quoted' words 'here'",), {"quoted": 1, "words": 1, "here": 1}),
            (("A-B a b 42 A",), {"a": 3, "b": 2}),
            (("'' ' ok",), {"ok": 1}),
            (("rock'n'roll ROCK'N'ROLL",), {"rock'n'roll": 2}),
        ],
        """
        import re

        def word_counts(text: str) -> dict[str, int]:
            counts: dict[str, int] = {}
            for raw in re.findall(r"[A-Za-z']+", text):
                word = raw.strip("'").lower()
                if word:
                    counts[word] = counts.get(word, 0) + 1
            return counts
        """,
        # Keeps the quotes around a quoted word.
        """
        import re

        def word_counts(text: str) -> dict[str, int]:
            counts: dict[str, int] = {}
            for raw in re.findall(r"[A-Za-z']+", text):
                word = raw.lower()
                if word.strip("'"):
                    counts[word] = counts.get(word, 0) + 1
            return counts
        """,
    ),
    problem(
        "common_prefix",
        "easy",
        "def common_prefix(words: list[str]) -> str:",
        """Return the longest string that every word in the list starts with. An empty list has
        the empty string as its common prefix.""",
        [
            ((["flower", "flow", "flight"],), "fl"),
            ((["dog", "racecar"],), ""),
            (([],), ""),
            ((["alone"],), "alone"),
            ((["same", "same", "same"],), "same"),
            ((["abc", "ab", ""],), ""),
            ((["prefix", "pre", "prelude"],), "pre"),
        ],
        """
        def common_prefix(words: list[str]) -> str:
            if not words:
                return ""
            prefix = words[0]
            for word in words[1:]:
                while not word.startswith(prefix):
                    prefix = prefix[:-1]
            return prefix
        """,
        # Fails on an empty list.
        """
        def common_prefix(words: list[str]) -> str:
            prefix = words[0]
            for word in words[1:]:
                while not word.startswith(prefix):
                    prefix = prefix[:-1]
            return prefix
        """,
    ),
    problem(
        "capitalize_words",
        "easy",
        "def capitalize_words(text: str) -> str:",
        """Upper-case the first character of every word and lower-case the rest of it, where words
        are separated by spaces. Keep the spaces exactly as they are (several in a row, leading or
        trailing). A character after an apostrophe or a digit inside a word is not a word start.""",
        [
            (("hello wORLD",), "Hello World"),
            (("don't  stop",), "Don't  Stop"),
            (("",), ""),
            ((" 3rd place ",), " 3rd Place "),
            (("ALL CAPS HERE",), "All Caps Here"),
            (("o'neil's cafe",), "O'neil's Cafe"),
        ],
        """
        def capitalize_words(text: str) -> str:
            return " ".join(w[:1].upper() + w[1:].lower() for w in text.split(" "))
        """,
        # str.title() starts a new word after an apostrophe or a digit.
        """
        def capitalize_words(text: str) -> str:
            return text.title()
        """,
    ),
    problem(
        "reverse_words",
        "easy",
        "def reverse_words(text: str) -> str:",
        """Return the words of the text in reverse order, separated by single spaces. Words are
        separated by any amount of whitespace, and leading or trailing whitespace is dropped.""",
        [
            (("the sky is blue",), "blue is sky the"),
            (("  hello   world  ",), "world hello"),
            (("",), ""),
            (("one",), "one"),
            (("a\tb\nc",), "c b a"),
        ],
        """
        def reverse_words(text: str) -> str:
            return " ".join(reversed(text.split()))
        """,
        # Splits on single spaces, so runs of spaces leave empty words.
        """
        def reverse_words(text: str) -> str:
            return " ".join(reversed(text.split(" ")))
        """,
    ),
    problem(
        "is_anagram",
        "easy",
        "def is_anagram(a: str, b: str) -> bool:",
        """Say whether two phrases are anagrams of each other: the same letters the same number
        of times, ignoring case and spaces (every other character counts).""",
        [
            (("Listen", "Silent"), True),
            (("apple", "paple!"), False),
            (("Dormitory", "dirty room"), True),
            (("", ""), True),
            (("aab", "abb"), False),
            (("a gentleman", "Elegant man"), True),
        ],
        """
        def is_anagram(a: str, b: str) -> bool:
            def key(s: str) -> list[str]:
                return sorted(s.lower().replace(" ", ""))
            return key(a) == key(b)
        """,
        # Does not ignore the spaces.
        """
        def is_anagram(a: str, b: str) -> bool:
            return sorted(a.lower()) == sorted(b.lower())
        """,
    ),
    problem(
        "wrap_text",
        "medium",
        "def wrap_text(text: str, width: int) -> list[str]:",
        """Wrap a text into lines of at most `width` characters, greedily: words (separated by
        whitespace) are placed on the current line, separated by one space, while they fit, and
        a word that does not fit starts a new line. A word longer than `width` gets a line of its
        own, unbroken. An empty or all-whitespace text gives no lines.""",
        [
            (("the quick brown fox", 10), ["the quick", "brown fox"]),
            (("a bb ccc", 4), ["a bb", "ccc"]),
            (("", 5), []),
            (("extraordinary is long", 5), ["extraordinary", "is", "long"]),
            (("one two three", 13), ["one two three"]),
            (("one two three", 12), ["one two", "three"]),
            (("  spaced   out  ", 20), ["spaced out"]),
        ],
        """
        def wrap_text(text: str, width: int) -> list[str]:
            lines: list[str] = []
            current = ""
            for word in text.split():
                if current and len(current) + 1 + len(word) <= width:
                    current += " " + word
                else:
                    if current:
                        lines.append(current)
                    current = word
            if current:
                lines.append(current)
            return lines
        """,
        # Off by one: a line may never reach exactly `width`.
        """
        def wrap_text(text: str, width: int) -> list[str]:
            lines: list[str] = []
            current = ""
            for word in text.split():
                if current and len(current) + 1 + len(word) < width:
                    current += " " + word
                else:
                    if current:
                        lines.append(current)
                    current = word
            if current:
                lines.append(current)
            return lines
        """,
    ),
    problem(
        "roman_to_int",
        "medium",
        "def roman_to_int(numeral: str) -> int:",
        """Convert a Roman numeral (upper case, in standard form, from I to MMMCMXCIX) to an
        integer. Remember the subtractive pairs IV, IX, XL, XC, CD and CM.""",
        [
            (("XIV",), 14),
            (("MCMXCIV",), 1994),
            (("I",), 1),
            (("MMMCMXCIX",), 3999),
            (("XLII",), 42),
            (("CDXLIV",), 444),
            (("LVIII",), 58),
        ],
        """
        def roman_to_int(numeral: str) -> int:
            values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
            total = 0
            for i, c in enumerate(numeral):
                v = values[c]
                if i + 1 < len(numeral) and values[numeral[i + 1]] > v:
                    total -= v
                else:
                    total += v
            return total
        """,
        # Adds every symbol, ignoring subtractive pairs.
        """
        def roman_to_int(numeral: str) -> int:
            values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
            return sum(values[c] for c in numeral)
        """,
    ),
    problem(
        "int_to_roman",
        "medium",
        "def int_to_roman(number: int) -> str:",
        """Write an integer from 1 to 3999 as a Roman numeral in standard form (upper case, with
        the subtractive pairs IV, IX, XL, XC, CD and CM). Raise ValueError for a number outside
        that range.""",
        [
            ((1994,), "MCMXCIV"),
            ((4,), "IV"),
            ((3999,), "MMMCMXCIX"),
            ((0,), Raises("ValueError")),
            ((40,), "XL"),
            ((888,), "DCCCLXXXVIII"),
            ((4000,), Raises("ValueError")),
            ((9,), "IX"),
        ],
        """
        def int_to_roman(number: int) -> str:
            if not 1 <= number <= 3999:
                raise ValueError(f"expected 1..3999, got {number}")
            table = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                     (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
            out = []
            for value, symbol in table:
                while number >= value:
                    out.append(symbol)
                    number -= value
            return "".join(out)
        """,
        # Knows no subtractive pairs: 4 becomes IIII.
        """
        def int_to_roman(number: int) -> str:
            if not 1 <= number <= 3999:
                raise ValueError(f"expected 1..3999, got {number}")
            out = []
            for value, symbol in [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]:
                while number >= value:
                    out.append(symbol)
                    number -= value
            return "".join(out)
        """,
    ),
    problem(
        "camel_to_snake",
        "medium",
        "def camel_to_snake(name: str) -> str:",
        """Convert a camelCase or PascalCase identifier to snake_case. A run of capitals is an
        acronym and stays one word, except that its last capital starts the next word when a
        lower-case letter follows it: "parseHTTPResponse" becomes "parse_http_response" and
        "getID" becomes "get_id". Digits stay attached to the word before them.""",
        [
            (("parseHTTPResponse",), "parse_http_response"),
            (("helloWorld",), "hello_world"),
            (("getID",), "get_id"),
            (("Simple",), "simple"),
            (("",), ""),
            (("version2Update",), "version2_update"),
            (("ABCDef",), "abc_def"),
            (("already_snake",), "already_snake"),
        ],
        """
        def camel_to_snake(name: str) -> str:
            out = []
            for i, c in enumerate(name):
                if c.isupper() and i > 0:
                    prev = name[i - 1]
                    nxt = name[i + 1] if i + 1 < len(name) else ""
                    if prev.islower() or prev.isdigit() or (prev.isupper() and nxt.islower()):
                        out.append("_")
                out.append(c.lower())
            return "".join(out)
        """,
        # Starts a new word at every capital, splitting acronyms letter by letter.
        """
        def camel_to_snake(name: str) -> str:
            out = []
            for i, c in enumerate(name):
                if c.isupper() and i > 0:
                    out.append("_")
                out.append(c.lower())
            return "".join(out)
        """,
    ),
    problem(
        "brackets_balanced",
        "easy",
        "def brackets_balanced(text: str) -> bool:",
        """Say whether the brackets (), [] and {} in the text are balanced and properly nested.
        Every other character is ignored.""",
        [
            (("f(a[1], {b: 2})",), True),
            (("([)]",), False),
            (("",), True),
            (("(((",), False),
            ((")(",), False),
            (("no brackets at all",), True),
            (("{[()()]}",), True),
            (("]",), False),
        ],
        """
        def brackets_balanced(text: str) -> bool:
            pairs = {")": "(", "]": "[", "}": "{"}
            stack = []
            for c in text:
                if c in "([{":
                    stack.append(c)
                elif c in pairs:
                    if not stack or stack.pop() != pairs[c]:
                        return False
            return not stack
        """,
        # Only counts opening and closing brackets of each kind.
        """
        def brackets_balanced(text: str) -> bool:
            return all(text.count(a) == text.count(b) for a, b in ["()", "[]", "{}"])
        """,
    ),
    problem(
        "first_unique_index",
        "easy",
        "def first_unique_index(text: str) -> int:",
        """Return the index of the first character that occurs exactly once in the text, or -1
        if there is none. Upper and lower case letters are different characters.""",
        [
            (("leetcode",), 0),
            (("loveleetcode",), 2),
            (("aabb",), -1),
            (("",), -1),
            (("aA",), 0),
            (("xxyzz",), 2),
        ],
        """
        from collections import Counter

        def first_unique_index(text: str) -> int:
            counts = Counter(text)
            for i, c in enumerate(text):
                if counts[c] == 1:
                    return i
            return -1
        """,
        # Finds the first character that is not repeated right after itself.
        """
        def first_unique_index(text: str) -> int:
            for i, c in enumerate(text):
                if c not in text[i + 1:]:
                    return i
            return -1
        """,
    ),
    problem(
        "longest_vowel_run",
        "easy",
        "def longest_vowel_run(text: str) -> int:",
        """Return the length of the longest run of consecutive vowels (a, e, i, o, u, in either
        case) in the text; 0 if it has no vowel.""",
        [
            (("beautiful",), 3),
            (("rhythm",), 0),
            (("",), 0),
            (("AEIou",), 5),
            (("queueing",), 5),
            (("a e i",), 1),
        ],
        """
        def longest_vowel_run(text: str) -> int:
            best = current = 0
            for c in text.lower():
                current = current + 1 if c in "aeiou" else 0
                best = max(best, current)
            return best
        """,
        # Forgets upper-case vowels.
        """
        def longest_vowel_run(text: str) -> int:
            best = current = 0
            for c in text:
                current = current + 1 if c in "aeiou" else 0
                best = max(best, current)
            return best
        """,
    ),
)
