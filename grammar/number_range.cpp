#include "grammar/number_range.h"

#include <cctype>
#include <stdexcept>
#include <vector>

namespace troupe::grammar {

namespace {

constexpr size_t kMaxFraction = 16;                   // digits after the point, as json-frac
constexpr int64_t kMaxWhole = 9'999'999'999'999'999;  // 16 digits, as json-int

std::string join(const std::vector<std::string>& alts) {
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out.append(i ? " | " : "").append(alts[i]);
  return out + ")";
}

std::string quoted(std::string_view digits) {
  return std::string("\"").append(digits) + "\"";
}

// Digit strings of one length from a to b, a <= b.
std::string same_length(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 1) return std::string("[") + a[0] + "-" + b[0] + "]";
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (a[0] == b[0]) return quoted(a.substr(0, 1)) + " " + same_length(ra, rb);
  std::vector<std::string> alts;
  char first = a[0], last = b[0];
  if (ra != std::string(n - 1, '0')) {
    alts.push_back(quoted(a.substr(0, 1)) + " " + same_length(ra, std::string(n - 1, '9')));
    ++first;
  }
  const bool hi_whole = rb == std::string(n - 1, '9');
  if (!hi_whole) --last;
  if (first <= last)
    alts.push_back(std::string("[") + first + "-" + last + "] [0-9]{" + std::to_string(n - 1) +
                   "}");
  if (!hi_whole)
    alts.push_back(quoted(b.substr(0, 1)) + " " + same_length(std::string(n - 1, '0'), rb));
  return join(alts);
}

// The fraction digits that may follow one whole part, given how the whole
// part compares with the range's ends: `low` (or `high`) when it equals the
// lower (upper) bound's, so that the fraction must keep the number on the
// right side of it. Read position by position, each side "tight" while the
// digits so far are the bound's own.
class FractionRange {
 public:
  struct Set {
    bool none_ok = false;  // the number may end without a fraction (or here)
    std::string digits;    // GBNF for the digits that may follow; "" for none
  };

  FractionRange(const NumberBound* low, const NumberBound* high) : low_(low), high_(high) {}

  Set from(size_t i, bool tight_low, bool tight_high) const {
    Set s;
    s.none_ok = may_end(i, tight_low, tight_high);
    const size_t left = kMaxFraction - i;
    if (left == 0) return s;
    if (!tight_low && !tight_high) {
      s.digits = "[0-9]{1," + std::to_string(left) + "}";
      return s;
    }
    const char lo = tight_low ? digit(low_->value.fraction, i) : '0';
    const char hi = tight_high ? digit(high_->value.fraction, i) : '9';
    if (lo > hi) return s;
    std::vector<std::string> alts;
    auto then = [&](const std::string& head, const Set& next) {
      if (next.digits.empty()) {
        if (next.none_ok) alts.push_back(head);
      } else {
        alts.push_back(head + " " + (next.none_ok ? "(" + next.digits + ")?" : next.digits));
      }
    };
    if (lo == hi) {
      then(quoted(std::string(1, lo)), from(i + 1, tight_low, tight_high));
      s.digits = join(alts);
      return s;
    }
    if (tight_low) then(quoted(std::string(1, lo)), from(i + 1, true, false));
    const char free_lo = tight_low ? char(lo + 1) : lo, free_hi = tight_high ? char(hi - 1) : hi;
    if (free_lo <= free_hi) {
      const std::string range = free_lo == free_hi
                                    ? quoted(std::string(1, free_lo))
                                    : std::string("[") + free_lo + "-" + free_hi + "]";
      alts.push_back(left > 1 ? range + " [0-9]{0," + std::to_string(left - 1) + "}" : range);
    }
    if (tight_high) then(quoted(std::string(1, hi)), from(i + 1, false, true));
    s.digits = join(alts);
    return s;
  }

 private:
  static char digit(const std::string& fraction, size_t i) {
    return i < fraction.size() ? fraction[i] : '0';
  }
  // Whether the number may end after i fraction digits: a bound the digits
  // so far equal has only zeros left exactly when i reaches its length
  // (its fraction has no trailing zeros), and then they are equal.
  bool may_end(size_t i, bool tight_low, bool tight_high) const {
    if (tight_low && (i < low_->value.fraction.size() || !low_->inclusive)) return false;
    if (tight_high && i >= high_->value.fraction.size() && !high_->inclusive) return false;
    return true;
  }

  const NumberBound* low_;
  const NumberBound* high_;
};

// A whole part's text followed by the fraction set, or "" when it is empty.
std::string with_fraction(const std::string& whole, const FractionRange::Set& f) {
  if (f.digits.empty()) return f.none_ok ? whole : "";
  return whole + " (\".\" " + f.digits + ")" + (f.none_ok ? "?" : "");
}

// The non-negative numbers m in [low, high] (high absent: any), both bounds
// non-negative.
std::string magnitudes(const NumberBound& low, const std::optional<NumberBound>& high) {
  const int64_t a = std::stoll(low.value.whole);
  const std::string any_fraction = "(\".\" [0-9]{1," + std::to_string(kMaxFraction) + "})?";
  std::vector<std::string> alts;
  auto add = [&](const std::string& alt) {
    if (!alt.empty()) alts.push_back(alt);
  };
  if (!high) {
    add(with_fraction(quoted(low.value.whole), FractionRange(&low, nullptr).from(0, true, false)));
    if (a + 1 <= kMaxWhole) add(natural_range(a + 1, std::nullopt) + " " + any_fraction);
    return join(alts);
  }
  const int64_t b = std::stoll(high->value.whole);
  if (a > b) return "";
  if (a == b)
    return with_fraction(quoted(low.value.whole), FractionRange(&low, &*high).from(0, true, true));
  add(with_fraction(quoted(low.value.whole), FractionRange(&low, nullptr).from(0, true, false)));
  if (a + 1 <= b - 1) add(natural_range(a + 1, b - 1) + " " + any_fraction);
  add(with_fraction(quoted(high->value.whole),
                    FractionRange(nullptr, &*high).from(0, false, true)));
  return join(alts);
}

bool is_zero(const Decimal& d) {
  return d.whole == "0" && d.fraction.empty();
}

}  // namespace

Decimal parse_decimal(std::string_view text) {
  std::string what = "'";
  what.append(text).append("' is not a number");
  size_t i = 0;
  Decimal d;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  std::string digits;  // all the mantissa's digits
  long point = 0;      // where the point is, counted in digits
  auto is_digit = [&](size_t k) { return k < text.size() && std::isdigit((unsigned char)text[k]); };
  if (!is_digit(i)) throw std::invalid_argument(what);
  while (is_digit(i)) digits += text[i++], ++point;
  if (i < text.size() && text[i] == '.') {
    if (!is_digit(++i)) throw std::invalid_argument(what);
    while (is_digit(i)) digits += text[i++];
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    bool minus = false;
    if (++i < text.size() && (text[i] == '+' || text[i] == '-')) minus = text[i++] == '-';
    if (!is_digit(i)) throw std::invalid_argument(what);
    long e = 0;
    while (is_digit(i)) {
      e = e * 10 + (text[i++] - '0');
      if (e > 1000)
        throw std::invalid_argument(what + " this server reads (its exponent is past 1000)");
    }
    point += minus ? -e : e;
  }
  if (i != text.size()) throw std::invalid_argument(what);
  if (point <= 0) {
    d.whole.assign(1, '0');
    d.fraction = std::string(size_t(-point), '0').append(digits);
  } else {
    if (size_t(point) > digits.size()) digits.append(size_t(point) - digits.size(), '0');
    d.whole = digits.substr(0, size_t(point));
    d.fraction = digits.substr(size_t(point));
  }
  d.whole.erase(0, std::min(d.whole.find_first_not_of('0'), d.whole.size() - 1));
  d.fraction.erase(d.fraction.find_last_not_of('0') + 1);
  if (is_zero(d)) d.negative = false;
  return d;
}

std::string decimal_range(const std::optional<NumberBound>& lower,
                          const std::optional<NumberBound>& upper) {
  std::vector<std::string> alts;
  // Zero and above: from the lower bound, or 0, up to the upper one.
  if (!upper || !upper->value.negative) {
    const NumberBound from =
        lower && !lower->value.negative ? *lower : NumberBound{Decimal{}, true};
    if (std::string m = magnitudes(from, upper); !m.empty()) alts.push_back(m);
  }
  // Below zero: "-" and a magnitude above |upper| (or 0), up to |lower|.
  if (!lower || lower->value.negative) {
    NumberBound from{Decimal{}, false};
    if (upper && upper->value.negative) from = *upper;
    from.value.negative = false;
    std::optional<NumberBound> to = lower;
    if (to) to->value.negative = false;
    if (std::string m = magnitudes(from, to); !m.empty()) alts.push_back("\"-\" " + m);
  }
  return join(alts);
}

std::string natural_range(int64_t from, std::optional<int64_t> to) {
  const std::string lo = std::to_string(from);
  const std::string hi = to ? std::to_string(*to) : std::string(16, '9');
  std::vector<std::string> alts;
  for (size_t n = lo.size(); n <= hi.size(); ++n) {
    const std::string a = n == lo.size() ? lo : std::string(1, '1').append(n - 1, '0');
    const std::string b = n == hi.size() ? hi : std::string(n, '9');
    alts.push_back(same_length(a, b));
  }
  return join(alts);
}

}  // namespace troupe::grammar
