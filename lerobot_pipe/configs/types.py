"""LeRobot's feature keys, feature types and normalization modes (its configs/types.py values),
shared by policies, processors and datasets without importing any of them."""

# Feature keys of LeRobot datasets and batches.
OBS_PREFIX = "observation."
OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
OBS_IMAGES_PREFIX = "observation.images."
OBS_LANGUAGE_PREFIX = "observation.language."  # the tokenized task (tokenizer_processor)
OBS_LANGUAGE_TOKENS = OBS_LANGUAGE_PREFIX + "tokens"  # a tokenized prompt (its ids)
OBS_LANGUAGE_ATTENTION_MASK = OBS_LANGUAGE_PREFIX + "attention_mask"  # and its real tokens
ACTION = "action"

# Policy feature types and normalization modes (LeRobot's FeatureType / NormalizationMode values).
FEATURE_TYPES = ("STATE", "ENV", "ACTION", "VISUAL")
NORMALIZATION_MODES = ("MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10", "IDENTITY")
