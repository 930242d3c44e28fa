#pragma once
// The numbers in a range, spelled as GBNF digit by digit, as JSON writes
// them: for JSON Schema's minimum, maximum and their exclusive forms.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::grammar {

// A decimal number exactly as a JSON text writes it: sign, integer digits
// (no leading zeros; "0"), fraction digits (no trailing zeros; "" for none).
// Zero is never negative.
struct Decimal {
  bool negative = false;
  std::string whole = "0";
  std::string fraction;
};

// A JSON number's text ("-12.50", "1e-05", "2.5E+3") as a Decimal. Throws
// std::invalid_argument for anything else (and exponents past 1000).
Decimal parse_decimal(std::string_view text);

struct NumberBound {
  Decimal value;
  bool inclusive = true;
};

// A GBNF expression for the decimal texts of the numbers in the range
// (either side open when absent), written without an exponent and with at
// most 16 digits either side of the point ("-0" and leading zeros never);
// "" when the range holds none.
std::string decimal_range(const std::optional<NumberBound>& lower,
                          const std::optional<NumberBound>& upper);

// A GBNF expression for the non-negative integers in [from, to] (to absent:
// up to 16 digits), as JSON writes them; from <= to.
std::string natural_range(int64_t from, std::optional<int64_t> to);

}  // namespace troupe::grammar
