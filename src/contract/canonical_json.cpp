// Canonical JSON (Python's json.dumps with sort_keys=True, separators=(",", ":")) and SHA-256.

#include <openssl/evp.h>

#include <array>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <string>
#include <system_error>

#include "contract/contract_json.hpp"
#include "detlogp/errors.hpp"

namespace detlogp {

std::string python_float_repr(double value) {
  if (!std::isfinite(value)) {
    throw ContractError(ErrorCode::out_of_range, "",
                        "JSON numbers must be finite; got " + std::to_string(value));
  }
  // Shortest round-trip digits in scientific form, e.g. "6.99999988079071e-01", "1e+16".
  std::array<char, 64> buf{};
  const auto res =
      std::to_chars(buf.data(), buf.data() + buf.size(), value, std::chars_format::scientific);
  if (res.ec != std::errc()) {
    throw std::runtime_error("python_float_repr: to_chars failed");
  }
  const std::string sci(buf.data(), res.ptr);

  std::string out;
  std::size_t pos = 0;
  if (sci[0] == '-') {
    out += '-';
    pos = 1;
  }
  const std::size_t e_pos = sci.find('e');
  std::string digits;
  for (std::size_t i = pos; i < e_pos; ++i) {
    if (sci[i] != '.') {
      digits += sci[i];
    }
  }
  const int exponent = std::stoi(sci.substr(e_pos + 1));  // value = d.ddd * 10^exponent
  const int decpt = exponent + 1;                         // value = 0.dddd * 10^decpt
  const int ndigits = static_cast<int>(digits.size());

  // CPython's float_repr_style "short": exponent form when decpt <= -4 or decpt > 16.
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (ndigits > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    out += 'e';
    out += exponent < 0 ? '-' : '+';
    const int mag = exponent < 0 ? -exponent : exponent;
    if (mag < 10) {
      out += '0';
    }
    out += std::to_string(mag);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-decpt), '0');
    out += digits;
  } else if (decpt < ndigits) {
    out.append(digits, 0, static_cast<std::size_t>(decpt));
    out += '.';
    out.append(digits, static_cast<std::size_t>(decpt), std::string::npos);
  } else {
    out += digits;
    out.append(static_cast<std::size_t>(decpt - ndigits), '0');
    out += ".0";
  }
  return out;
}

namespace {

void append_string(std::string& out, const std::string& s) {
  // nlohmann's ensure_ascii escaping equals Python's ensure_ascii=True: \" \\ \b \f \n \r \t,
  // other control characters and everything from 0x7f up as lowercase \uXXXX (surrogate pairs
  // above the BMP).
  out += nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/true);
}

void append_canonical(std::string& out, const nlohmann::json& value) {
  using Type = nlohmann::json::value_t;
  switch (value.type()) {
    case Type::null:
      out += "null";
      return;
    case Type::boolean:
      out += value.get<bool>() ? "true" : "false";
      return;
    case Type::number_integer:
      out += std::to_string(value.get<std::int64_t>());
      return;
    case Type::number_unsigned:
      out += std::to_string(value.get<std::uint64_t>());
      return;
    case Type::number_float:
      out += python_float_repr(value.get<double>());
      return;
    case Type::string:
      append_string(out, value.get_ref<const std::string&>());
      return;
    case Type::array: {
      out += '[';
      bool first = true;
      for (const auto& item : value) {
        if (!first) {
          out += ',';
        }
        first = false;
        append_canonical(out, item);
      }
      out += ']';
      return;
    }
    case Type::object: {
      // nlohmann::json keeps objects in a std::map: keys come sorted bytewise, which for UTF-8
      // is code-point order, the order of Python's sort_keys.
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) {
          out += ',';
        }
        first = false;
        append_string(out, key);
        out += ':';
        append_canonical(out, item);
      }
      out += '}';
      return;
    }
    case Type::binary:
    case Type::discarded:
      break;
  }
  throw ContractError("canonical_json: value has no JSON representation");
}

}  // namespace

std::string canonical_json(const nlohmann::json& value) {
  std::string out;
  append_canonical(out, value);
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed (OpenSSL EVP_Digest)");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * static_cast<std::size_t>(length));
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace detlogp
