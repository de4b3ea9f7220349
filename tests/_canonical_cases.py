"""Keys and floats where the TypeScript text and a naive one part (shared by the tests)."""

# Keys whose TypeScript order differs from code-point order, or that lower-case oddly:
# mixed case and case collisions, Unicode case-mapping specials (ß, İ, final Σ, the Kelvin
# sign, an astral capital), astral and high-BMP keys (UTF-16 order is not code-point order
# there), array-index keys and near misses, ``__proto__``.
SPECIAL_KEYS = [
    "a", "A", "b", "B", "Id", "id", "ID", "Tier", "Host", "accept", "x-api-key",
    "X-Forwarded-For", "orderId", "OrderID", "_x", "[", "é", "É", "ß", "SS", "ss",
    "\u0130", "i\u0307", "\u0131", "\u03a3", "\u03c3", "\u03c2", "\u0391\u03a3",
    "\u212a", "k", "\U00010400", "\U00010428", "\U0001f600", "\uff5a", "\ufb00",
    "0", "1", "2", "9", "10", "01", "-1", "1.5", "4294967294", "4294967295", "__proto__",
]  # fmt: skip
# Floats at every boundary where orjson's text and JavaScript's could part.
EDGE_FLOATS = [
    0.5, -0.5, 1e-5, -1e-5, 9.999999999999999e-6, 1e-6, 2.5e-6, 9.9e-7, 1e-7, 5e-324,
    -5e-324, 2.2250738585072014e-308, 1e16, 9999999999999998.0, 1.5e17, 1e20,
    9.999999999999999e20, 1e21, 6.02214076e23, 1.7976931348623157e308, -1.7976931348623157e308,
    2.0**53, 2.0**53 + 2, -(2.0**53), 132.0, -132.0, 0.0, -0.0, 0.1 + 0.2,
]  # fmt: skip
