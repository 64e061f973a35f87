// ds41 core: minimal structured logging to stderr ("ds41 LEVEL component: message").
// The level is set once at start-up by the CLI; library code only calls log_*.
#pragma once

#include <string>
#include <string_view>

namespace ds41 {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, std::string_view component, std::string_view message);

inline void log_debug(std::string_view c, std::string_view m) { log_message(LogLevel::kDebug, c, m); }
inline void log_info(std::string_view c, std::string_view m) { log_message(LogLevel::kInfo, c, m); }
inline void log_warn(std::string_view c, std::string_view m) { log_message(LogLevel::kWarn, c, m); }
inline void log_error(std::string_view c, std::string_view m) { log_message(LogLevel::kError, c, m); }

}  // namespace ds41
