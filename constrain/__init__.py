from constrain.vocabulary import Vocabulary
