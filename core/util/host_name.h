// This machine's host name (gethostname), "?" when it cannot be read: for messages and for the
// records that name where a process runs.
#pragma once

#include <unistd.h>

#include <string>

namespace dtrain {

inline std::string HostName() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "?";
}

}  // namespace dtrain
