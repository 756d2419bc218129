"""Problems about lists and matrices: slicing, reordering, grouping and scanning sequences."""

from __future__ import annotations

from agentrl.envs.codesandbox.problem import Problem, Raises, problem

PROBLEMS: tuple[Problem, ...] = (
    problem(
        "chunked",
        "easy",
        "def chunked(items: list, size: int) -> list[list]:",
        """Split a list into consecutive chunks of `size` items; the last chunk may be shorter.
        Raise ValueError if `size` is less than 1.""",
        [
            (([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]]),
            (([], 3), []),
            ((["a", "b"], 5), [["a", "b"]]),
            (([1, 2, 3], 0), Raises("ValueError")),
            (([1, 2, 3], 1), [[1], [2], [3]]),
            (([1, 2, 3, 4], -2), Raises("ValueError")),
        ],
        """
        def chunked(items: list, size: int) -> list[list]:
            if size < 1:
                raise ValueError(f"size must be at least 1, got {size}")
            return [items[i:i + size] for i in range(0, len(items), size)]
        """,
        # A negative size slips through as an empty result.
        """
        def chunked(items: list, size: int) -> list[list]:
            if size == 0:
                raise ValueError("size must not be 0")
            return [items[i:i + size] for i in range(0, len(items), max(size, 1))] if size > 0 else []
        """,
    ),
    problem(
        "flatten",
        "easy",
        "def flatten(nested: list) -> list:",
        """Flatten a list that may contain lists, nested to any depth, into one flat list of the
        non-list items in order. Empty lists vanish.""",
        [
            (([1, [2, [3, [4]]], 5],), [1, 2, 3, 4, 5]),
            (([],), []),
            (([[], [[]], 7],), [7]),
            ((["a", ["bc", ["d"]]],), ["a", "bc", "d"]),
            (([[1, 2], [3, 4]],), [1, 2, 3, 4]),
        ],
        """
        def flatten(nested: list) -> list:
            out = []
            for item in nested:
                if isinstance(item, list):
                    out.extend(flatten(item))
                else:
                    out.append(item)
            return out
        """,
        # Flattens one level only.
        """
        def flatten(nested: list) -> list:
            out = []
            for item in nested:
                if isinstance(item, list):
                    out.extend(item)
                else:
                    out.append(item)
            return out
        """,
    ),
    problem(
        "rotate_right",
        "easy",
        "def rotate_right(items: list, k: int) -> list:",
        """Return the list rotated `k` places to the right (the last item moves to the front for
        k = 1). `k` may be larger than the list or negative (a left rotation). Do not change the
        list you are given.""",
        [
            (([1, 2, 3, 4, 5], 2), [4, 5, 1, 2, 3]),
            (([1, 2, 3], -1), [2, 3, 1]),
            (([], 4), []),
            (([1, 2, 3], 7), [3, 1, 2]),
            ((["x"], 100), ["x"]),
            (([1, 2, 3, 4], 0), [1, 2, 3, 4]),
        ],
        """
        def rotate_right(items: list, k: int) -> list:
            if not items:
                return []
            k %= len(items)
            return items[-k:] + items[:-k] if k else list(items)
        """,
        # Forgets to reduce k modulo the length.
        """
        def rotate_right(items: list, k: int) -> list:
            if not items or k == 0:
                return list(items)
            return items[-k:] + items[:-k]
        """,
    ),
    problem(
        "unique_in_order",
        "easy",
        "def unique_in_order(items: list) -> list:",
        """Remove repeated items from a list, keeping the first occurrence of each, in the order
        they first appear. Items are hashable.""",
        [
            (([3, 1, 3, 2, 1],), [3, 1, 2]),
            (([],), []),
            ((["b", "a", "b", "c", "a"],), ["b", "a", "c"]),
            (([5, 5, 5],), [5]),
            (([2, 10, 1, 10],), [2, 10, 1]),
        ],
        """
        def unique_in_order(items: list) -> list:
            return list(dict.fromkeys(items))
        """,
        # Sorts instead of keeping the order of first appearance.
        """
        def unique_in_order(items: list) -> list:
            return sorted(set(items))
        """,
    ),
    problem(
        "second_largest",
        "easy",
        "def second_largest(numbers: list[int]) -> int | None:",
        """Return the second largest distinct value in the list, or None if there are fewer than
        two distinct values.""",
        [
            (([4, 1, 7, 3],), 4),
            (([7, 7, 7],), None),
            (([],), None),
            (([5, 9, 9],), 5),
            (([-2, -5, -1],), -2),
            (([1, 2],), 1),
        ],
        """
        def second_largest(numbers: list[int]) -> int | None:
            distinct = sorted(set(numbers))
            return distinct[-2] if len(distinct) >= 2 else None
        """,
        # Does not skip repeats of the largest value.
        """
        def second_largest(numbers: list[int]) -> int | None:
            ordered = sorted(numbers)
            return ordered[-2] if len(ordered) >= 2 else None
        """,
    ),
    problem(
        "merge_sorted",
        "easy",
        "def merge_sorted(a: list[int], b: list[int]) -> list[int]:",
        """Merge two lists that are each sorted in ascending order into one sorted list, keeping
        duplicates.""",
        [
            (([1, 4, 9], [2, 3, 10, 12]), [1, 2, 3, 4, 9, 10, 12]),
            (([], [1, 2]), [1, 2]),
            (([5, 6], []), [5, 6]),
            (([1, 1, 3], [1, 2]), [1, 1, 1, 2, 3]),
            (([], []), []),
            (([7, 8, 9], [1]), [1, 7, 8, 9]),
        ],
        """
        def merge_sorted(a: list[int], b: list[int]) -> list[int]:
            out, i, j = [], 0, 0
            while i < len(a) and j < len(b):
                if a[i] <= b[j]:
                    out.append(a[i])
                    i += 1
                else:
                    out.append(b[j])
                    j += 1
            return out + a[i:] + b[j:]
        """,
        # Drops whatever is left of the longer list.
        """
        def merge_sorted(a: list[int], b: list[int]) -> list[int]:
            out, i, j = [], 0, 0
            while i < len(a) and j < len(b):
                if a[i] <= b[j]:
                    out.append(a[i])
                    i += 1
                else:
                    out.append(b[j])
                    j += 1
            return out
        """,
    ),
    problem(
        "moving_average",
        "easy",
        "def moving_average(values: list[float], window: int) -> list[float]:",
        """Return the averages of every run of `window` consecutive values, in order (a list of
        len(values) - window + 1 floats, empty if the list is shorter than the window). Raise
        ValueError if `window` is less than 1.""",
        [
            (([1, 2, 3, 4, 5], 2), [1.5, 2.5, 3.5, 4.5]),
            (([10, 20], 3), []),
            (([4, 4, 4], 3), [4.0]),
            (([1, 2], 0), Raises("ValueError")),
            (([0.5, 1.5, -1.0, 3.0], 1), [0.5, 1.5, -1.0, 3.0]),
            (([1, 2, 4, 8], 3), [7 / 3, 14 / 3]),
        ],
        """
        def moving_average(values: list[float], window: int) -> list[float]:
            if window < 1:
                raise ValueError(f"window must be at least 1, got {window}")
            return [sum(values[i:i + window]) / window for i in range(len(values) - window + 1)]
        """,
        # Misses the last window.
        """
        def moving_average(values: list[float], window: int) -> list[float]:
            if window < 1:
                raise ValueError(f"window must be at least 1, got {window}")
            return [sum(values[i:i + window]) / window for i in range(len(values) - window)]
        """,
    ),
    problem(
        "max_subarray_sum",
        "medium",
        "def max_subarray_sum(numbers: list[int]) -> int:",
        """Return the largest sum of a non-empty run of consecutive numbers in the list (which
        has at least one number). If all numbers are negative, that is the largest single
        number.""",
        [
            (([-2, 1, -3, 4, -1, 2, 1, -5, 4],), 6),
            (([-3, -1, -2],), -1),
            (([5],), 5),
            (([2, -1, 2],), 3),
            (([-1, 0, -2],), 0),
            (([1, 2, 3, -10, 4, 5],), 9),
        ],
        """
        def max_subarray_sum(numbers: list[int]) -> int:
            best = current = numbers[0]
            for x in numbers[1:]:
                current = max(x, current + x)
                best = max(best, current)
            return best
        """,
        # Starts the best sum at 0, as if an empty run were allowed.
        """
        def max_subarray_sum(numbers: list[int]) -> int:
            best = current = 0
            for x in numbers:
                current = max(0, current + x)
                best = max(best, current)
            return best
        """,
    ),
    problem(
        "pairs_summing_to",
        "medium",
        "def pairs_summing_to(numbers: list[int], target: int) -> list[tuple[int, int]]:",
        """Return every distinct pair of values (a, b) with a <= b, taken from two different
        positions of the list, whose sum is `target`. List the pairs sorted, with no pair
        twice.""",
        [
            (([1, 5, 3, 3, 7, -1], 6), [(-1, 7), (1, 5), (3, 3)]),
            (([3], 6), []),
            (([], 0), []),
            (([2, 2, 2], 4), [(2, 2)]),
            (([4, 1, 0, 5, 4], 5), [(0, 5), (1, 4)]),
            (([-3, 3, 0, 0], 0), [(-3, 3), (0, 0)]),
        ],
        """
        from collections import Counter

        def pairs_summing_to(numbers: list[int], target: int) -> list[tuple[int, int]]:
            counts = Counter(numbers)
            pairs = set()
            for a in counts:
                b = target - a
                if a <= b and b in counts and (a != b or counts[a] >= 2):
                    pairs.add((a, b))
            return sorted(pairs)
        """,
        # Pairs a value with itself even when it occurs only once.
        """
        def pairs_summing_to(numbers: list[int], target: int) -> list[tuple[int, int]]:
            values = set(numbers)
            return sorted({(a, target - a) for a in values if a <= target - a and target - a in values})
        """,
    ),
    problem(
        "interleave",
        "easy",
        "def interleave(a: list, b: list) -> list:",
        """Interleave two lists, starting with the first item of `a`, then the first of `b`, and
        so on; when one list runs out, append the rest of the other.""",
        [
            (([1, 2, 3], ["a", "b", "c"]), [1, "a", 2, "b", 3, "c"]),
            (([1], [2, 3, 4]), [1, 2, 3, 4]),
            (([], []), []),
            (([1, 2, 3], []), [1, 2, 3]),
            ((["x", "y", "z"], [0]), ["x", 0, "y", "z"]),
        ],
        """
        def interleave(a: list, b: list) -> list:
            out = []
            for i in range(max(len(a), len(b))):
                if i < len(a):
                    out.append(a[i])
                if i < len(b):
                    out.append(b[i])
            return out
        """,
        # zip stops at the shorter list.
        """
        def interleave(a: list, b: list) -> list:
            return [x for pair in zip(a, b) for x in pair]
        """,
    ),
    problem(
        "consecutive_runs",
        "easy",
        "def consecutive_runs(numbers: list[int]) -> list[list[int]]:",
        """Split a list of integers into runs where each number is exactly one more than the
        number before it, keeping the list's order.""",
        [
            (([1, 2, 3, 5, 6, 9],), [[1, 2, 3], [5, 6], [9]]),
            (([],), []),
            (([4],), [[4]]),
            (([3, 2, 1],), [[3], [2], [1]]),
            (([1, 1, 2],), [[1], [1, 2]]),
            (([-1, 0, 1, 3],), [[-1, 0, 1], [3]]),
        ],
        """
        def consecutive_runs(numbers: list[int]) -> list[list[int]]:
            runs: list[list[int]] = []
            for x in numbers:
                if runs and x == runs[-1][-1] + 1:
                    runs[-1].append(x)
                else:
                    runs.append([x])
            return runs
        """,
        # Lets a run go on through a repeated number.
        """
        def consecutive_runs(numbers: list[int]) -> list[list[int]]:
            runs: list[list[int]] = []
            for x in numbers:
                if runs and 0 <= x - runs[-1][-1] <= 1:
                    runs[-1].append(x)
                else:
                    runs.append([x])
            return runs
        """,
    ),
    problem(
        "transpose",
        "easy",
        "def transpose(matrix: list[list[int]]) -> list[list[int]]:",
        """Return the transpose of a matrix given as a list of rows (row i of the result is column
        i of the input). An empty matrix transposes to an empty list. Raise ValueError if the rows
        are not all the same length.""",
        [
            (([[1, 2, 3], [4, 5, 6]],), [[1, 4], [2, 5], [3, 6]]),
            (([],), []),
            (([[7]],), [[7]]),
            (([[1, 2], [3]],), Raises("ValueError")),
            (([[1], [2], [3]],), [[1, 2, 3]]),
        ],
        """
        def transpose(matrix: list[list[int]]) -> list[list[int]]:
            if any(len(row) != len(matrix[0]) for row in matrix):
                raise ValueError("rows of different lengths")
            return [list(col) for col in zip(*matrix)]
        """,
        # zip silently cuts ragged rows.
        """
        def transpose(matrix: list[list[int]]) -> list[list[int]]:
            return [list(col) for col in zip(*matrix)]
        """,
    ),
    problem(
        "spiral_order",
        "medium",
        "def spiral_order(matrix: list[list[int]]) -> list[int]:",
        """Return the items of a rectangular matrix (a list of equal-length rows) in clockwise
        spiral order, starting at the top left and going right first.""",
        [
            (([[1, 2, 3], [4, 5, 6], [7, 8, 9]],), [1, 2, 3, 6, 9, 8, 7, 4, 5]),
            (([[1, 2, 3, 4], [5, 6, 7, 8]],), [1, 2, 3, 4, 8, 7, 6, 5]),
            (([],), []),
            (([[1], [2], [3]],), [1, 2, 3]),
            (([[1, 2], [3, 4], [5, 6]],), [1, 2, 4, 6, 5, 3]),
            (([[5]],), [5]),
        ],
        """
        def spiral_order(matrix: list[list[int]]) -> list[int]:
            out = []
            rows = [list(r) for r in matrix]
            while rows:
                out.extend(rows.pop(0))
                rows = [list(r) for r in zip(*rows)][::-1]
            return out
        """,
        # Never checks that a row or column is left, so a single column comes out with repeats.
        """
        def spiral_order(matrix: list[list[int]]) -> list[int]:
            out = []
            if not matrix:
                return out
            top, bottom, left, right = 0, len(matrix) - 1, 0, len(matrix[0]) - 1
            while top <= bottom and left <= right:
                out.extend(matrix[top][c] for c in range(left, right + 1))
                out.extend(matrix[r][right] for r in range(top + 1, bottom + 1))
                out.extend(matrix[bottom][c] for c in range(right - 1, left - 1, -1))
                out.extend(matrix[r][left] for r in range(bottom - 1, top, -1))
                top, bottom, left, right = top + 1, bottom - 1, left + 1, right - 1
            return out
        """,
    ),
    problem(
        "longest_rising_run",
        "easy",
        "def longest_rising_run(numbers: list[int]) -> int:",
        """Return the length of the longest run of consecutive items that strictly increase;
        0 for an empty list.""",
        [
            (([1, 3, 5, 4, 7],), 3),
            (([2, 2, 2],), 1),
            (([],), 0),
            (([5, 4, 3, 2, 1],), 1),
            (([1, 2, 3, 4],), 4),
            (([3, 1, 2, 3, 0, 1],), 3),
        ],
        """
        def longest_rising_run(numbers: list[int]) -> int:
            best = current = 0
            for i, x in enumerate(numbers):
                current = current + 1 if i and x > numbers[i - 1] else 1
                best = max(best, current)
            return best
        """,
        # Counts equal neighbours as rising.
        """
        def longest_rising_run(numbers: list[int]) -> int:
            best = current = 0
            for i, x in enumerate(numbers):
                current = current + 1 if i and x >= numbers[i - 1] else 1
                best = max(best, current)
            return best
        """,
    ),
    problem(
        "majority_element",
        "easy",
        "def majority_element(items: list[int]) -> int | None:",
        """Return the value that fills more than half of the list, or None if no value does.""",
        [
            (([3, 1, 3, 3, 2],), 3),
            (([1, 2, 1, 2],), None),
            (([],), None),
            (([7],), 7),
            (([1, 2, 3, 1, 1],), 1),
            (([4, 4, 5, 5, 6],), None),
        ],
        """
        from collections import Counter

        def majority_element(items: list[int]) -> int | None:
            if not items:
                return None
            value, count = Counter(items).most_common(1)[0]
            return value if count * 2 > len(items) else None
        """,
        # Returns the most common value even without a majority.
        """
        from collections import Counter

        def majority_element(items: list[int]) -> int | None:
            if not items:
                return None
            return Counter(items).most_common(1)[0][0]
        """,
    ),
)
