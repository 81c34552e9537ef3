// TrainConfig as JSON: how a run's configuration travels to a viewer that attaches to it
// (engine/monitor), so the viewer knows the model, data, strategy and schedule the ranks run.
// Every row of engine/train/settings.h round-trips under its key; enums travel by their flag
// names, so a mistyped value is named. A key the text lacks keeps its default, so an older run's
// JSON still loads.
#pragma once
#include <string>

#include "engine/train/train.h"

namespace dtlab {

std::string train_config_to_json(const TrainConfig& c);
// dtlab::Error (one sentence naming the field) for text that is not a configuration.
TrainConfig train_config_from_json(const std::string& text);

}  // namespace dtlab
