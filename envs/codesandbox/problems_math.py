"""Problems about numbers: primes, digits, sequences, bases and counting."""

from __future__ import annotations

import math

from agentrl.envs.codesandbox.problem import Problem, Raises, problem

PROBLEMS: tuple[Problem, ...] = (
    problem(
        "is_prime",
        "easy",
        "def is_prime(n: int) -> bool:",
        """Say whether the integer n is prime. Numbers below 2 (including negative ones) are not
        prime. n can be as large as 10**12, so test divisors only up to its square root.""",
        [
            ((7,), True),
            ((1,), False),
            ((2,), True),
            ((0,), False),
            ((-7,), False),
            ((91,), False),
            ((999_999_999_989,), True),
            ((1_000_000_000_000,), False),
        ],
        """
        def is_prime(n: int) -> bool:
            if n < 2:
                return False
            d = 2
            while d * d <= n:
                if n % d == 0:
                    return False
                d += 1
            return True
        """,
        # Treats 1 as prime.
        """
        def is_prime(n: int) -> bool:
            if n < 1:
                return False
            d = 2
            while d * d <= n:
                if n % d == 0:
                    return False
                d += 1
            return True
        """,
    ),
    problem(
        "gcd_of_list",
        "easy",
        "def gcd_of_list(numbers: list[int]) -> int:",
        """Return the greatest common divisor of all the numbers in the list, as a non-negative
        integer. Negative numbers count by their absolute value; the gcd of an empty list, or of
        zeros only, is 0.""",
        [
            (([12, 18, 24],), 6),
            (([7, 13],), 1),
            (([],), 0),
            (([0, 0],), 0),
            (([-4, 6],), 2),
            (([-8, -12],), 4),
            (([0, 9],), 9),
            (([100],), 100),
        ],
        """
        import math

        def gcd_of_list(numbers: list[int]) -> int:
            result = 0
            for x in numbers:
                result = math.gcd(result, x)
            return result
        """,
        # Keeps the sign of a negative number.
        """
        def gcd_of_list(numbers: list[int]) -> int:
            result = 0
            for x in numbers:
                a, b = result, x
                while b:
                    a, b = b, a % b
                result = a
            return result
        """,
    ),
    problem(
        "digital_root",
        "easy",
        "def digital_root(n: int) -> int:",
        """Repeatedly replace a non-negative integer by the sum of its decimal digits until a
        single digit is left, and return that digit.""",
        [
            ((38,), 2),
            ((0,), 0),
            ((9,), 9),
            ((99_999_999_999,), 9),
            ((10,), 1),
            ((123_456_789,), 9),
        ],
        """
        def digital_root(n: int) -> int:
            while n >= 10:
                n = sum(int(d) for d in str(n))
            return n
        """,
        # Sums the digits only once.
        """
        def digital_root(n: int) -> int:
            return sum(int(d) for d in str(n)) if n >= 10 else n
        """,
    ),
    problem(
        "collatz_steps",
        "easy",
        "def collatz_steps(n: int) -> int:",
        """Count the steps the Collatz rule takes to bring a positive integer n down to 1: an even
        number is halved, an odd one becomes 3n + 1. Reaching 1 takes 0 steps from 1. Raise
        ValueError if n is less than 1.""",
        [
            ((6,), 8),
            ((1,), 0),
            ((27,), 111),
            ((0,), Raises("ValueError")),
            ((16,), 4),
            ((97,), 118),
        ],
        """
        def collatz_steps(n: int) -> int:
            if n < 1:
                raise ValueError(f"n must be positive, got {n}")
            steps = 0
            while n != 1:
                n = n // 2 if n % 2 == 0 else 3 * n + 1
                steps += 1
            return steps
        """,
        # Counts the numbers visited instead of the steps between them.
        """
        def collatz_steps(n: int) -> int:
            if n < 1:
                raise ValueError(f"n must be positive, got {n}")
            seen = [n]
            while n != 1:
                n = n // 2 if n % 2 == 0 else 3 * n + 1
                seen.append(n)
            return len(seen)
        """,
    ),
    problem(
        "prime_factors",
        "easy",
        "def prime_factors(n: int) -> list[int]:",
        """Return the prime factors of an integer n >= 2 in ascending order, each repeated as
        often as it divides n (so that their product is n).""",
        [
            ((60,), [2, 2, 3, 5]),
            ((13,), [13]),
            ((2,), [2]),
            ((1024,), [2] * 10),
            ((9_699_690,), [2, 3, 5, 7, 11, 13, 17, 19]),
            ((49,), [7, 7]),
            ((2 * 999_983,), [2, 999_983]),
        ],
        """
        def prime_factors(n: int) -> list[int]:
            factors = []
            d = 2
            while d * d <= n:
                while n % d == 0:
                    factors.append(d)
                    n //= d
                d += 1
            if n > 1:
                factors.append(n)
            return factors
        """,
        # Forgets the prime that is left over after the loop.
        """
        def prime_factors(n: int) -> list[int]:
            factors = []
            d = 2
            while d * d <= n:
                while n % d == 0:
                    factors.append(d)
                    n //= d
                d += 1
            return factors
        """,
    ),
    problem(
        "fibonacci",
        "easy",
        "def fibonacci(n: int) -> int:",
        """Return the n-th Fibonacci number, where fibonacci(0) = 0 and fibonacci(1) = 1, for n
        from 0 to 300. It must be fast: each call gets well under a second.""",
        [
            ((10,), 55),
            ((0,), 0),
            ((1,), 1),
            ((2,), 1),
            ((90,), 2_880_067_194_370_816_120),
            ((300,), 222_232_244_629_420_445_529_739_893_461_909_967_206_666_939_096_499_764_990_979_600),
        ],
        """
        def fibonacci(n: int) -> int:
            a, b = 0, 1
            for _ in range(n):
                a, b = b, a + b
            return a
        """,
        # Exponential recursion: right, but far too slow for large n.
        """
        def fibonacci(n: int) -> int:
            return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
        """,
    ),
    problem(
        "to_base",
        "medium",
        "def to_base(n: int, base: int) -> str:",
        """Write the integer n in the given base, from 2 to 36, with digits 0-9 then lower-case
        a-z and a leading '-' for a negative number; zero is "0". Raise ValueError for a base
        outside 2..36.""",
        [
            ((255, 16), "ff"),
            ((-10, 2), "-1010"),
            ((0, 7), "0"),
            ((35, 36), "z"),
            ((5, 1), Raises("ValueError")),
            ((123_456_789, 36), "21i3v9"),
            ((8, 8), "10"),
        ],
        """
        def to_base(n: int, base: int) -> str:
            if not 2 <= base <= 36:
                raise ValueError(f"base must be 2..36, got {base}")
            digits = "0123456789abcdefghijklmnopqrstuvwxyz"
            if n == 0:
                return "0"
            sign, n = ("-", -n) if n < 0 else ("", n)
            out = []
            while n:
                n, r = divmod(n, base)
                out.append(digits[r])
            return sign + "".join(reversed(out))
        """,
        # Returns an empty string for zero.
        """
        def to_base(n: int, base: int) -> str:
            if not 2 <= base <= 36:
                raise ValueError(f"base must be 2..36, got {base}")
            digits = "0123456789abcdefghijklmnopqrstuvwxyz"
            sign, n = ("-", -n) if n < 0 else ("", n)
            out = []
            while n:
                n, r = divmod(n, base)
                out.append(digits[r])
            return sign + "".join(reversed(out))
        """,
    ),
    problem(
        "perfect_numbers",
        "easy",
        "def perfect_numbers(limit: int) -> list[int]:",
        """Return, in ascending order, the perfect numbers up to and including `limit`: numbers
        equal to the sum of their divisors smaller than themselves (6 = 1 + 2 + 3). limit is at
        most 10000.""",
        [
            ((30,), [6, 28]),
            ((5,), []),
            ((6,), [6]),
            ((10_000,), [6, 28, 496, 8128]),
            ((1,), []),
        ],
        """
        def perfect_numbers(limit: int) -> list[int]:
            found = []
            for n in range(2, limit + 1):
                total = 1
                d = 2
                while d * d <= n:
                    if n % d == 0:
                        total += d
                        if d != n // d:
                            total += n // d
                    d += 1
                if total == n:
                    found.append(n)
            return found
        """,
        # Counts 1 as perfect (its proper divisors sum to... 1, if you start the sum at 1).
        """
        def perfect_numbers(limit: int) -> list[int]:
            found = []
            for n in range(1, limit + 1):
                total = 1
                d = 2
                while d * d <= n:
                    if n % d == 0:
                        total += d
                        if d != n // d:
                            total += n // d
                    d += 1
                if total == n:
                    found.append(n)
            return found
        """,
    ),
    problem(
        "leap_years",
        "easy",
        "def leap_years(start: int, end: int) -> int:",
        """Count the leap years of the Gregorian calendar from year `start` to year `end`, both
        included (0 if start > end). A year is a leap year if it is divisible by 4, except that
        years divisible by 100 are not, unless they are also divisible by 400.""",
        [
            ((2000, 2004), 2),
            ((1900, 1900), 0),
            ((2001, 2003), 0),
            ((1600, 2000), 98),
            ((2010, 2000), 0),
            ((1, 400), 97),
        ],
        """
        def leap_years(start: int, end: int) -> int:
            return sum(1 for y in range(start, end + 1) if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0))
        """,
        # Every fourth year, century rule forgotten.
        """
        def leap_years(start: int, end: int) -> int:
            return sum(1 for y in range(start, end + 1) if y % 4 == 0)
        """,
    ),
    problem(
        "pascal_row",
        "easy",
        "def pascal_row(n: int) -> list[int]:",
        """Return row n of Pascal's triangle, counting from row 0, which is [1]: the binomial
        coefficients C(n, 0) .. C(n, n).""",
        [
            ((4,), [1, 4, 6, 4, 1]),
            ((0,), [1]),
            ((1,), [1, 1]),
            ((6,), [1, 6, 15, 20, 15, 6, 1]),
            ((30,), [math.comb(30, k) for k in range(31)]),
            ((60,), [math.comb(60, k) for k in range(61)]),
        ],
        """
        def pascal_row(n: int) -> list[int]:
            row = [1]
            for k in range(n):
                row.append(row[k] * (n - k) // (k + 1))
            return row
        """,
        # Float arithmetic: exact for small rows, off by rounding once the numbers pass 2**53.
        """
        def pascal_row(n: int) -> list[int]:
            row = [1.0]
            for k in range(n):
                row.append(row[k] * (n - k) / (k + 1))
            return [int(x) for x in row]
        """,
    ),
    problem(
        "factorial_trailing_zeros",
        "medium",
        "def factorial_trailing_zeros(n: int) -> int:",
        """Return how many zeros n! ends with in decimal, for 0 <= n <= 10**9, without computing
        n! itself.""",
        [
            ((10,), 2),
            ((0,), 0),
            ((4,), 0),
            ((25,), 6),
            ((100,), 24),
            ((1_000_000_000,), 249_999_998),
        ],
        """
        def factorial_trailing_zeros(n: int) -> int:
            count = 0
            power = 5
            while power <= n:
                count += n // power
                power *= 5
            return count
        """,
        # Counts multiples of 5 only, missing the extra factors of 25, 125, ...
        """
        def factorial_trailing_zeros(n: int) -> int:
            return n // 5
        """,
    ),
    problem(
        "is_happy",
        "easy",
        "def is_happy(n: int) -> bool:",
        """A positive integer is happy if repeatedly replacing it by the sum of the squares of its
        decimal digits eventually reaches 1 (otherwise it loops forever without reaching 1). Say
        whether n is happy.""",
        [
            ((19,), True),
            ((2,), False),
            ((1,), True),
            ((7,), True),
            ((4,), False),
            ((100,), True),
            ((116,), False),
        ],
        """
        def is_happy(n: int) -> bool:
            seen = set()
            while n != 1 and n not in seen:
                seen.add(n)
                n = sum(int(d) ** 2 for d in str(n))
            return n == 1
        """,
        # Gives up after a few rounds instead of detecting the loop.
        """
        def is_happy(n: int) -> bool:
            for _ in range(3):
                if n == 1:
                    return True
                n = sum(int(d) ** 2 for d in str(n))
            return n == 1
        """,
    ),
    problem(
        "smallest_multiple",
        "easy",
        "def smallest_multiple(n: int) -> int:",
        """Return the smallest positive integer divisible by every integer from 1 to n (for
        1 <= n <= 60).""",
        [
            ((10,), 2520),
            ((1,), 1),
            ((2,), 2),
            ((20,), 232_792_560),
            ((60,), 9_690_712_164_777_231_700_912_800),
        ],
        """
        import math

        def smallest_multiple(n: int) -> int:
            result = 1
            for k in range(1, n + 1):
                result = result * k // math.gcd(result, k)
            return result
        """,
        # Multiplies the primes up to n, forgetting prime powers such as 4 and 8.
        """
        def smallest_multiple(n: int) -> int:
            result = 1
            for k in range(2, n + 1):
                if all(k % d for d in range(2, k)):
                    result *= k
            return result
        """,
    ),
)
