"""Problems about classic algorithms: search, graphs, grids and dynamic programming."""

from __future__ import annotations

from agentrl.envs.codesandbox.problem import Problem, Raises, problem

PROBLEMS: tuple[Problem, ...] = (
    problem(
        "leftmost_index",
        "medium",
        "def leftmost_index(items: list[int], target: int) -> int:",
        """Given a list sorted in ascending order (possibly with repeats) and a target, return the
        index of the first occurrence of the target, or -1 if it is absent. Use binary search:
        the list may be long.""",
        [
            (([1, 2, 2, 2, 3], 2), 1),
            (([1, 3, 5], 4), -1),
            (([], 1), -1),
            (([7, 7, 7, 7], 7), 0),
            (([1, 2, 3], 3), 2),
            (([1, 2, 3], 0), -1),
        ],
        """
        import bisect

        def leftmost_index(items: list[int], target: int) -> int:
            i = bisect.bisect_left(items, target)
            return i if i < len(items) and items[i] == target else -1
        """,
        # A plain binary search: finds some occurrence, not necessarily the first.
        """
        def leftmost_index(items: list[int], target: int) -> int:
            lo, hi = 0, len(items) - 1
            while lo <= hi:
                mid = (lo + hi) // 2
                if items[mid] == target:
                    return mid
                if items[mid] < target:
                    lo = mid + 1
                else:
                    hi = mid - 1
            return -1
        """,
    ),
    problem(
        "task_order",
        "hard",
        "def task_order(deps: dict[str, list[str]]) -> list[str]:",
        """`deps` maps each task to the tasks that must be done before it; every task named
        anywhere (as a key or in a list) must be scheduled. Return an order that does every task
        after all of its prerequisites, choosing the alphabetically smallest ready task whenever
        several are ready. Raise ValueError if the dependencies form a cycle.""",
        [
            (({"c": ["a", "b"], "b": ["a"]},), ["a", "b", "c"]),
            (({"x": ["y"], "y": ["x"]},), Raises("ValueError")),
            (({},), []),
            (({"b": [], "a": []},), ["a", "b"]),
            (({"d": ["b"], "c": ["a"], "b": [], "a": []},), ["a", "b", "c", "d"]),
            (({"z": ["m"], "m": []},), ["m", "z"]),
            (({"b": ["a"], "a": ["a"]},), Raises("ValueError")),
            (({"deploy": ["test", "build"], "test": ["build"]},), ["build", "test", "deploy"]),
        ],
        """
        import heapq

        def task_order(deps: dict[str, list[str]]) -> list[str]:
            tasks = set(deps)
            for before in deps.values():
                tasks.update(before)
            waiting = {t: set(deps.get(t, [])) for t in tasks}
            ready = [t for t in tasks if not waiting[t]]
            heapq.heapify(ready)
            order = []
            while ready:
                task = heapq.heappop(ready)
                order.append(task)
                for other in tasks:
                    if task in waiting[other]:
                        waiting[other].discard(task)
                        if not waiting[other]:
                            heapq.heappush(ready, other)
            if len(order) != len(tasks):
                raise ValueError("the dependencies form a cycle")
            return order
        """,
        # Picks ready tasks in first-seen order instead of alphabetically.
        """
        def task_order(deps: dict[str, list[str]]) -> list[str]:
            tasks = list(dict.fromkeys([t for k, v in deps.items() for t in [*v, k]]))
            done: list[str] = []
            while len(done) < len(tasks):
                for t in tasks:
                    if t not in done and all(d in done for d in deps.get(t, [])):
                        done.append(t)
                        break
                else:
                    raise ValueError("the dependencies form a cycle")
            return done
        """,
    ),
    problem(
        "grid_distance",
        "medium",
        "def grid_distance(grid: list[str]) -> int:",
        """The grid is a list of equal-length strings: '.' is open floor, '#' is a wall, 'S' is
        the start and 'E' the exit (one of each). Moving one step up, down, left or right onto a
        non-wall cell costs 1. Return the fewest steps from S to E, or -1 if E cannot be
        reached.""",
        [
            ((["S.#", "..#", "#.E"],), 4),
            ((["S#E"],), -1),
            ((["SE"],), 1),
            ((["S....", "####.", "E...."],), 10),
            ((["S.", ".#", ".E"],), 3),
            (([".S.", "###", ".E."],), -1),
        ],
        """
        from collections import deque

        def grid_distance(grid: list[str]) -> int:
            rows, cols = len(grid), len(grid[0])
            start = next((r, c) for r in range(rows) for c in range(cols) if grid[r][c] == "S")
            queue = deque([(start, 0)])
            seen = {start}
            while queue:
                (r, c), d = queue.popleft()
                if grid[r][c] == "E":
                    return d
                for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                    if 0 <= nr < rows and 0 <= nc < cols and grid[nr][nc] != "#" and (nr, nc) not in seen:
                        seen.add((nr, nc))
                        queue.append(((nr, nc), d + 1))
            return -1
        """,
        # Also moves diagonally.
        """
        from collections import deque

        def grid_distance(grid: list[str]) -> int:
            rows, cols = len(grid), len(grid[0])
            start = next((r, c) for r in range(rows) for c in range(cols) if grid[r][c] == "S")
            queue = deque([(start, 0)])
            seen = {start}
            while queue:
                (r, c), d = queue.popleft()
                if grid[r][c] == "E":
                    return d
                for dr in (-1, 0, 1):
                    for dc in (-1, 0, 1):
                        nr, nc = r + dr, c + dc
                        if 0 <= nr < rows and 0 <= nc < cols and grid[nr][nc] != "#" and (nr, nc) not in seen:
                            seen.add((nr, nc))
                            queue.append(((nr, nc), d + 1))
            return -1
        """,
    ),
    problem(
        "fewest_coins",
        "medium",
        "def fewest_coins(coins: list[int], amount: int) -> int:",
        """Return the fewest coins that add up to `amount`, using any number of each coin value
        in `coins` (positive integers), or -1 if the amount cannot be made. An amount of 0 needs
        0 coins.""",
        [
            (([1, 2, 5], 11), 3),
            (([2], 3), -1),
            (([1], 0), 0),
            (([1, 3, 4], 6), 2),
            (([5, 10], 35), 4),
            (([7, 3], 1), -1),
            (([9, 6, 1], 12), 2),
        ],
        """
        def fewest_coins(coins: list[int], amount: int) -> int:
            best = [0] + [-1] * amount
            for a in range(1, amount + 1):
                options = [best[a - c] for c in coins if c <= a and best[a - c] >= 0]
                best[a] = min(options) + 1 if options else -1
            return best[amount]
        """,
        # Greedy: the largest coin first is not always best.
        """
        def fewest_coins(coins: list[int], amount: int) -> int:
            count = 0
            for c in sorted(coins, reverse=True):
                count += amount // c
                amount %= c
            return count if amount == 0 else -1
        """,
    ),
    problem(
        "edit_distance",
        "medium",
        "def edit_distance(a: str, b: str) -> int:",
        """Return the Levenshtein distance between two strings: the fewest single-character
        insertions, deletions and substitutions that turn a into b.""",
        [
            (("kitten", "sitting"), 3),
            (("", "abc"), 3),
            (("same", "same"), 0),
            (("flaw", "lawn"), 2),
            (("abc", ""), 3),
            (("intention", "execution"), 5),
        ],
        """
        def edit_distance(a: str, b: str) -> int:
            previous = list(range(len(b) + 1))
            for i, ca in enumerate(a, 1):
                current = [i]
                for j, cb in enumerate(b, 1):
                    current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
                previous = current
            return previous[-1]
        """,
        # Compares position by position and adds the difference in length.
        """
        def edit_distance(a: str, b: str) -> int:
            return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
        """,
    ),
    problem(
        "lcs_length",
        "medium",
        "def lcs_length(a: str, b: str) -> int:",
        """Return the length of the longest common subsequence of two strings (characters in the
        same order in both, not necessarily next to each other).""",
        [
            (("abcde", "ace"), 3),
            (("abc", "def"), 0),
            (("", "x"), 0),
            (("AGGTAB", "GXTXAYB"), 4),
            (("aaaa", "aa"), 2),
            (("abcba", "abcbcba"), 5),
            (("abc", "cba"), 1),
        ],
        """
        def lcs_length(a: str, b: str) -> int:
            previous = [0] * (len(b) + 1)
            for ca in a:
                current = [0]
                for j, cb in enumerate(b, 1):
                    current.append(previous[j - 1] + 1 if ca == cb else max(previous[j], current[j - 1]))
                previous = current
            return previous[-1]
        """,
        # Counts shared characters, ignoring their order.
        """
        from collections import Counter

        def lcs_length(a: str, b: str) -> int:
            return sum((Counter(a) & Counter(b)).values())
        """,
    ),
    problem(
        "count_islands",
        "medium",
        "def count_islands(grid: list[str]) -> int:",
        """The grid is a list of equal-length strings of '#' (land) and '.' (water). Count the
        islands: groups of land cells connected through their up, down, left and right
        neighbours (diagonal neighbours are not connected).""",
        [
            ((["##..", "#..#", "...#"],), 2),
            ((["#.#", ".#.", "#.#"],), 5),
            (([],), 0),
            ((["...."],), 0),
            ((["####", "#..#", "####"],), 1),
            ((["#"],), 1),
        ],
        """
        def count_islands(grid: list[str]) -> int:
            seen = set()
            islands = 0
            for r in range(len(grid)):
                for c in range(len(grid[r])):
                    if grid[r][c] != "#" or (r, c) in seen:
                        continue
                    islands += 1
                    stack = [(r, c)]
                    seen.add((r, c))
                    while stack:
                        y, x = stack.pop()
                        for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                            if 0 <= ny < len(grid) and 0 <= nx < len(grid[ny]) and grid[ny][nx] == "#" and (ny, nx) not in seen:
                                seen.add((ny, nx))
                                stack.append((ny, nx))
            return islands
        """,
        # Connects diagonal neighbours too.
        """
        def count_islands(grid: list[str]) -> int:
            seen = set()
            islands = 0
            for r in range(len(grid)):
                for c in range(len(grid[r])):
                    if grid[r][c] != "#" or (r, c) in seen:
                        continue
                    islands += 1
                    stack = [(r, c)]
                    seen.add((r, c))
                    while stack:
                        y, x = stack.pop()
                        for ny in (y - 1, y, y + 1):
                            for nx in (x - 1, x, x + 1):
                                if 0 <= ny < len(grid) and 0 <= nx < len(grid[ny]) and grid[ny][nx] == "#" and (ny, nx) not in seen:
                                    seen.add((ny, nx))
                                    stack.append((ny, nx))
            return islands
        """,
    ),
    problem(
        "merge_intervals",
        "medium",
        "def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:",
        """Merge overlapping closed intervals [start, end] (given in any order) and return the
        merged ones sorted by start. Intervals that merely touch, like [1, 3] and [3, 5], merge
        too.""",
        [
            (([[1, 3], [2, 6], [8, 10], [15, 18]],), [[1, 6], [8, 10], [15, 18]]),
            (([[1, 3], [3, 5]],), [[1, 5]]),
            (([],), []),
            (([[5, 7], [1, 2]],), [[1, 2], [5, 7]]),
            (([[1, 10], [2, 3], [4, 5]],), [[1, 10]]),
            (([[4, 4], [4, 4]],), [[4, 4]]),
        ],
        """
        def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:
            merged: list[list[int]] = []
            for start, end in sorted(intervals):
                if merged and start <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            return merged
        """,
        # Does not merge intervals that only touch.
        """
        def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:
            merged: list[list[int]] = []
            for start, end in sorted(intervals):
                if merged and start < merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            return merged
        """,
    ),
    problem(
        "knapsack",
        "hard",
        "def knapsack(items: list[tuple[int, int]], capacity: int) -> int:",
        """Each item is a (weight, value) pair of positive integers and can be taken at most once.
        Return the largest total value of items whose total weight is at most `capacity`.""",
        [
            (([(1, 1), (3, 4), (4, 5), (5, 7)], 7), 9),
            (([], 10), 0),
            (([(5, 10)], 4), 0),
            (([(2, 3), (2, 3), (3, 5)], 4), 6),
            (([(10, 60), (20, 100), (30, 120)], 50), 220),
            (([(1, 2)] * 5, 3), 6),
        ],
        """
        def knapsack(items: list[tuple[int, int]], capacity: int) -> int:
            best = [0] * (capacity + 1)
            for weight, value in items:
                for c in range(capacity, weight - 1, -1):
                    best[c] = max(best[c], best[c - weight] + value)
            return best[capacity]
        """,
        # Greedy by value per weight.
        """
        def knapsack(items: list[tuple[int, int]], capacity: int) -> int:
            total = 0
            for weight, value in sorted(items, key=lambda it: it[1] / it[0], reverse=True):
                if weight <= capacity:
                    capacity -= weight
                    total += value
            return total
        """,
    ),
    problem(
        "count_queens",
        "hard",
        "def count_queens(n: int) -> int:",
        """Return the number of ways to place n queens on an n x n chessboard so that no two
        attack each other (no two share a row, a column or a diagonal), for 1 <= n <= 9.""",
        [
            ((4,), 2),
            ((1,), 1),
            ((2,), 0),
            ((3,), 0),
            ((6,), 4),
            ((8,), 92),
            ((9,), 352),
        ],
        """
        def count_queens(n: int) -> int:
            def place(row: int, cols: set, diag: set, anti: set) -> int:
                if row == n:
                    return 1
                total = 0
                for c in range(n):
                    if c in cols or row - c in diag or row + c in anti:
                        continue
                    total += place(row + 1, cols | {c}, diag | {row - c}, anti | {row + c})
                return total
            return place(0, set(), set(), set())
        """,
        # Checks only one of the two diagonal directions.
        """
        def count_queens(n: int) -> int:
            def place(row: int, cols: set, diag: set) -> int:
                if row == n:
                    return 1
                total = 0
                for c in range(n):
                    if c in cols or row - c in diag:
                        continue
                    total += place(row + 1, cols | {c}, diag | {row - c})
                return total
            return place(0, set(), set())
        """,
    ),
    problem(
        "can_split_evenly",
        "medium",
        "def can_split_evenly(numbers: list[int]) -> bool:",
        """Say whether a list of non-negative integers can be split into two groups (every number
        in exactly one group, a group may be empty) with equal sums.""",
        [
            (([1, 5, 11, 5],), True),
            (([1, 2, 3, 5],), False),
            (([],), True),
            (([2, 2],), True),
            (([3, 3, 3, 4, 5],), True),
            (([7],), False),
            (([0, 0],), True),
            (([1, 1, 4],), False),
            (([10, 2, 2, 2],), False),
        ],
        """
        def can_split_evenly(numbers: list[int]) -> bool:
            total = sum(numbers)
            if total % 2:
                return False
            reachable = {0}
            for x in numbers:
                reachable |= {r + x for r in reachable}
            return total // 2 in reachable
        """,
        # Checks only that the total is even.
        """
        def can_split_evenly(numbers: list[int]) -> bool:
            return sum(numbers) % 2 == 0
        """,
    ),
    problem(
        "next_permutation",
        "medium",
        "def next_permutation(numbers: list[int]) -> list[int]:",
        """Return the next arrangement of the numbers in lexicographic order; the last
        arrangement (descending order) wraps around to the first (ascending order). Repeated
        numbers are allowed. Return a new list.""",
        [
            (([1, 2, 3],), [1, 3, 2]),
            (([3, 2, 1],), [1, 2, 3]),
            (([1, 1, 5],), [1, 5, 1]),
            (([],), []),
            (([1, 3, 2],), [2, 1, 3]),
            (([2, 3, 1, 3, 3],), [2, 3, 3, 1, 3]),
            (([5, 1, 1],), [1, 1, 5]),
        ],
        """
        def next_permutation(numbers: list[int]) -> list[int]:
            a = list(numbers)
            i = len(a) - 2
            while i >= 0 and a[i] >= a[i + 1]:
                i -= 1
            if i >= 0:
                j = len(a) - 1
                while a[j] <= a[i]:
                    j -= 1
                a[i], a[j] = a[j], a[i]
            a[i + 1:] = reversed(a[i + 1:])
            return a
        """,
        # Swaps with the last larger number but forgets to reverse the tail.
        """
        def next_permutation(numbers: list[int]) -> list[int]:
            a = list(numbers)
            i = len(a) - 2
            while i >= 0 and a[i] >= a[i + 1]:
                i -= 1
            if i < 0:
                return sorted(a)
            j = len(a) - 1
            while a[j] <= a[i]:
                j -= 1
            a[i], a[j] = a[j], a[i]
            return a
        """,
    ),
    problem(
        "longest_unique_window",
        "medium",
        "def longest_unique_window(text: str) -> int:",
        """Return the length of the longest stretch of consecutive characters of the text in which
        no character appears twice. The text can be long: aim for one pass over it.""",
        [
            (("abcabcbb",), 3),
            (("bbbbb",), 1),
            (("",), 0),
            (("pwwkew",), 3),
            (("abba",), 2),
            (("dvdf",), 3),
            (("abcdefghij" * 1_000 + "xyz",), 13),
        ],
        """
        def longest_unique_window(text: str) -> int:
            last: dict[str, int] = {}
            start = best = 0
            for i, c in enumerate(text):
                if c in last and last[c] >= start:
                    start = last[c] + 1
                last[c] = i
                best = max(best, i - start + 1)
            return best
        """,
        # Moves the window start back when it meets an old repeat ("abba").
        """
        def longest_unique_window(text: str) -> int:
            last: dict[str, int] = {}
            start = best = 0
            for i, c in enumerate(text):
                if c in last:
                    start = last[c] + 1
                last[c] = i
                best = max(best, i - start + 1)
            return best
        """,
    ),
)
