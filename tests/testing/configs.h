// The recipes shipped under configs/ and the catalog's clusters, as the tests load them.
// Header-only because tests/CMakeLists.txt compiles only *_test.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "core/recipe/recipe.h"
#include "gtest/gtest.h"
#include "parallel/planner/catalog.h"

namespace dtrain::testing {

// configs/<name>.yaml with `overrides` ("key=value") applied; a failure fails the test.
inline Recipe ShippedRecipe(const std::string& name,
                            const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<Recipe> recipe =
      LoadRecipe(std::string(DTRAIN_SOURCE_DIR) + "/configs/" + name + ".yaml", overrides);
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return recipe.ok() ? *std::move(recipe) : Recipe();
}

// The model of configs/<name>.yaml.
inline ModelConfig ShippedModelConfig(const std::string& name) {
  const Recipe recipe = ShippedRecipe(name);
  return ModelConfigFromRecipe(recipe.model, recipe.d_ff());
}

// `nodes` nodes of catalog GPU `gpu` on catalog network `network` (of `gpus_per_node`, else
// the section's default); a failure fails the test.
inline ClusterSpec CatalogCluster(int nodes, const std::string& gpu, const std::string& network,
                                  int gpus_per_node = 0) {
  ClusterSection section;
  section.nodes = nodes;
  if (gpus_per_node > 0) section.gpus_per_node = gpus_per_node;
  section.gpu = gpu;
  section.network = network;
  absl::StatusOr<ClusterSpec> cluster = ResolveCluster(section);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : ClusterSpec();
}

}  // namespace dtrain::testing
