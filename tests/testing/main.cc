// The test binaries' main. Each test process works in a temporary folder of its own: TEST_TMPDIR,
// which testing::TempDir() returns, and TMPDIR, which the processes a test starts (dtrain, its
// workers, torch's launcher) write under. The folder is removed when every test passed and kept,
// with its path printed, when one failed (one that crashed leaves /tmp/dtrain-tests.* unnamed:
// printed at the start, the path would be in the output of death tests' children), so a run
// leaves nothing behind but what explains a failure.
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::error_code error;
  const std::filesystem::path base = std::filesystem::temp_directory_path(error);
  std::string folder = ((error ? "/tmp" : base) / "dtrain-tests.XXXXXX").string();
  if (mkdtemp(folder.data()) == nullptr) {
    std::perror(("cannot make the tests' temporary folder " + folder).c_str());
    return 1;
  }
  // As /tmp's files were: readable by the services a test starts under other users.
  chmod(folder.c_str(), 0755);
  setenv("TEST_TMPDIR", folder.c_str(), 1);
  setenv("TMPDIR", folder.c_str(), 1);
  const int result = RUN_ALL_TESTS();
  if (result == 0) {
    std::filesystem::remove_all(folder, error);
  } else {
    std::fprintf(stderr, "the failed tests' files are kept in %s\n", folder.c_str());
  }
  return result;
}
