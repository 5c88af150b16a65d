"""Where the user side of synthetic dialogues comes from.

Three sources, all offline:

* `TOPICS` / `TOPIC_KEYWORDS`: the toy world's everyday topics in seven languages, used by the
  scripted responder to talk about a topic and to decide whether a reply is on topic.
* `all_user_turns` / `sample_user_turns` / `split_user_turns`: the built-in generator, English
  templates (`PHRASINGS`) filled with a topic.
* `load_user_turns`: a user's own dialogues in the Hugging Face `messages` format (JSONL, Parquet,
  a `datasets` folder) or a plain text file, whose user turns are reused; the reading and
  validation live in `gatt.dialogues` (`load_dialogues`, `validate_messages`, re-exported here).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gatt.checks import Check
# Re-exported: data_gen's callers read a user's dialogues from here.
from gatt.dialogues import DIALOGUE_FORMATS, ROLES, OnError, load_dialogues, load_user_texts, validate_messages

__all__ = [
    "DIALOGUE_FORMATS", "LANGUAGE_CODES", "PHRASINGS", "ROLES", "TOPICS", "TOPIC_KEYWORDS", "UserTurn",
    "all_user_turns", "load_dialogues", "load_user_turns", "on_topic_check", "sample_user_turns", "split_user_turns",
    "validate_messages",
]

LANGUAGE_CODES = ("en", "fr", "es", "de", "it", "pt", "nl")

# Each topic as it is written in running text: with the definite article where the language's
# generic use takes one (Romance languages always; English, German and Dutch only for unique
# things such as "the ocean", not for plurals and mass nouns such as "volcanoes" or "Kaffee").
# Topics are things and phenomena, never activities, so that none doubles as a hobby value.
TOPICS: dict[str, dict[str, str]] = {
    "ocean": {"en": "the ocean", "fr": "l'océan", "es": "el océano", "de": "der Ozean",
              "it": "l'oceano", "pt": "o oceano", "nl": "de oceaan"},
    "music": {"en": "music", "fr": "la musique", "es": "la música", "de": "Musik",
              "it": "la musica", "pt": "a música", "nl": "muziek"},
    "coffee": {"en": "coffee", "fr": "le café", "es": "el café", "de": "Kaffee",
               "it": "il caffè", "pt": "o café", "nl": "koffie"},
    "volcanoes": {"en": "volcanoes", "fr": "les volcans", "es": "los volcanes", "de": "Vulkane",
                  "it": "i vulcani", "pt": "os vulcões", "nl": "vulkanen"},
    "moon": {"en": "the moon", "fr": "la lune", "es": "la luna", "de": "der Mond",
             "it": "la luna", "pt": "a lua", "nl": "de maan"},
    "rainforests": {"en": "rainforests", "fr": "les forêts tropicales", "es": "las selvas tropicales",
                    "de": "Regenwälder", "it": "le foreste pluviali", "pt": "as florestas tropicais",
                    "nl": "regenwouden"},
    "dolphins": {"en": "dolphins", "fr": "les dauphins", "es": "los delfines", "de": "Delfine",
                 "it": "i delfini", "pt": "os golfinhos", "nl": "dolfijnen"},
    "dinosaurs": {"en": "dinosaurs", "fr": "les dinosaures", "es": "los dinosaurios",
                  "de": "Dinosaurier", "it": "i dinosauri", "pt": "os dinossauros",
                  "nl": "dinosaurussen"},
    "chocolate": {"en": "chocolate", "fr": "le chocolat", "es": "el chocolate", "de": "Schokolade",
                  "it": "il cioccolato", "pt": "o chocolate", "nl": "chocolade"},
    "cheese": {"en": "cheese", "fr": "le fromage", "es": "el queso", "de": "Käse",
               "it": "il formaggio", "pt": "o queijo", "nl": "kaas"},
    "rivers": {"en": "rivers", "fr": "les rivières", "es": "los ríos", "de": "Flüsse",
               "it": "i fiumi", "pt": "os rios", "nl": "rivieren"},
    "mountains": {"en": "mountains", "fr": "les montagnes", "es": "las montañas", "de": "Berge",
                  "it": "le montagne", "pt": "as montanhas", "nl": "bergen"},
    "deserts": {"en": "deserts", "fr": "les déserts", "es": "los desiertos", "de": "Wüsten",
                "it": "i deserti", "pt": "os desertos", "nl": "woestijnen"},
    "glaciers": {"en": "glaciers", "fr": "les glaciers", "es": "los glaciares", "de": "Gletscher",
                 "it": "i ghiacciai", "pt": "os glaciares", "nl": "gletsjers"},
    "rainbows": {"en": "rainbows", "fr": "les arcs-en-ciel", "es": "los arcoíris", "de": "Regenbogen",
                 "it": "gli arcobaleni", "pt": "os arco-íris", "nl": "regenbogen"},
    "solar_system": {"en": "the solar system", "fr": "le système solaire", "es": "el sistema solar",
                     "de": "das Sonnensystem", "it": "il sistema solare", "pt": "o sistema solar",
                     "nl": "het zonnestelsel"},
    "universe": {"en": "the universe", "fr": "l'univers", "es": "el universo", "de": "das Universum",
                 "it": "l'universo", "pt": "o universo", "nl": "het heelal"},
    "comets": {"en": "comets", "fr": "les comètes", "es": "los cometas", "de": "Kometen",
               "it": "le comete", "pt": "os cometas", "nl": "kometen"},
    "electricity": {"en": "electricity", "fr": "l'électricité", "es": "la electricidad",
                    "de": "Elektrizität", "it": "l'elettricità", "pt": "a eletricidade",
                    "nl": "elektriciteit"},
    "libraries": {"en": "libraries", "fr": "les bibliothèques", "es": "las bibliotecas",
                  "de": "Bibliotheken", "it": "le biblioteche", "pt": "as bibliotecas",
                  "nl": "bibliotheken"},
    "museums": {"en": "museums", "fr": "les musées", "es": "los museos", "de": "Museen",
                "it": "i musei", "pt": "os museus", "nl": "musea"},
    "bridges": {"en": "bridges", "fr": "les ponts", "es": "los puentes", "de": "Brücken",
                "it": "i ponti", "pt": "as pontes", "nl": "bruggen"},
    "castles": {"en": "castles", "fr": "les châteaux forts", "es": "los castillos", "de": "Burgen",
                "it": "i castelli", "pt": "os castelos", "nl": "kastelen"},
    "pyramids": {"en": "pyramids", "fr": "les pyramides", "es": "las pirámides", "de": "Pyramiden",
                 "it": "le piramidi", "pt": "as pirâmides", "nl": "piramides"},
    "clocks": {"en": "clocks", "fr": "les horloges", "es": "los relojes", "de": "Uhren",
               "it": "gli orologi", "pt": "os relógios", "nl": "klokken"},
    "honey": {"en": "honey", "fr": "le miel", "es": "la miel", "de": "Honig",
              "it": "il miele", "pt": "o mel", "nl": "honing"},
    "apples": {"en": "apples", "fr": "les pommes", "es": "las manzanas", "de": "Äpfel",
               "it": "le mele", "pt": "as maçãs", "nl": "appels"},
    "soup": {"en": "soup", "fr": "la soupe", "es": "la sopa", "de": "Suppe",
             "it": "la zuppa", "pt": "a sopa", "nl": "soep"},
    "brain": {"en": "the brain", "fr": "le cerveau", "es": "el cerebro", "de": "das Gehirn",
              "it": "il cervello", "pt": "o cérebro", "nl": "de hersenen"},
    "dreams": {"en": "dreams", "fr": "les rêves", "es": "los sueños", "de": "Träume",
               "it": "i sogni", "pt": "os sonhos", "nl": "dromen"},
    "lighthouses": {"en": "lighthouses", "fr": "les phares", "es": "los faros", "de": "Leuchttürme",
                    "it": "i fari", "pt": "os faróis", "nl": "vuurtorens"},
    "butterflies": {"en": "butterflies", "fr": "les papillons", "es": "las mariposas",
                    "de": "Schmetterlinge", "it": "le farfalle", "pt": "as borboletas",
                    "nl": "vlinders"},
    "owls": {"en": "owls", "fr": "les chouettes", "es": "los búhos", "de": "Eulen",
             "it": "i gufi", "pt": "as corujas", "nl": "uilen"},
    "elephants": {"en": "elephants", "fr": "les éléphants", "es": "los elefantes", "de": "Elefanten",
                  "it": "gli elefanti", "pt": "os elefantes", "nl": "olifanten"},
    "whales": {"en": "whales", "fr": "les baleines", "es": "las ballenas", "de": "Wale",
               "it": "le balene", "pt": "as baleias", "nl": "walvissen"},
    "penguins": {"en": "penguins", "fr": "les manchots", "es": "los pingüinos", "de": "Pinguine",
                 "it": "i pinguini", "pt": "os pinguins", "nl": "pinguïns"},
    "islands": {"en": "islands", "fr": "les îles", "es": "las islas", "de": "Inseln",
                "it": "le isole", "pt": "as ilhas", "nl": "eilanden"},
    "earthquakes": {"en": "earthquakes", "fr": "les tremblements de terre", "es": "los terremotos",
                    "de": "Erdbeben", "it": "i terremoti", "pt": "os terremotos",
                    "nl": "aardbevingen"},
    "snow": {"en": "snow", "fr": "la neige", "es": "la nieve", "de": "Schnee",
             "it": "la neve", "pt": "a neve", "nl": "sneeuw"},
    "gravity": {"en": "gravity", "fr": "la gravité", "es": "la gravedad", "de": "die Schwerkraft",
                "it": "la gravità", "pt": "a gravidade", "nl": "de zwaartekracht"},
    "photosynthesis": {"en": "photosynthesis", "fr": "la photosynthèse", "es": "la fotosíntesis",
                       "de": "die Photosynthese", "it": "la fotosintesi", "pt": "a fotossíntese",
                       "nl": "fotosynthese"},
    "roman_empire": {"en": "the Roman Empire", "fr": "l'Empire romain", "es": "el Imperio romano",
                     "de": "das Römische Reich", "it": "l'Impero romano", "pt": "o Império Romano",
                     "nl": "het Romeinse Rijk"},
    "ancient_egypt": {"en": "ancient Egypt", "fr": "l'Égypte antique", "es": "el antiguo Egipto",
                      "de": "das alte Ägypten", "it": "l'antico Egitto", "pt": "o Antigo Egito",
                      "nl": "het oude Egypte"},
    "vikings": {"en": "the Vikings", "fr": "les Vikings", "es": "los vikingos", "de": "die Wikinger",
                "it": "i vichinghi", "pt": "os vikings", "nl": "de Vikingen"},
    "fairy_tales": {"en": "fairy tales", "fr": "les contes de fées", "es": "los cuentos de hadas",
                    "de": "Märchen", "it": "le fiabe", "pt": "os contos de fadas", "nl": "sprookjes"},
    "airplanes": {"en": "airplanes", "fr": "les avions", "es": "los aviones", "de": "Flugzeuge",
                  "it": "gli aerei", "pt": "os aviões", "nl": "vliegtuigen"},
    "submarines": {"en": "submarines", "fr": "les sous-marins", "es": "los submarinos",
                   "de": "U-Boote", "it": "i sottomarini", "pt": "os submarinos",
                   "nl": "onderzeeërs"},
    "coral_reefs": {"en": "coral reefs", "fr": "les récifs coralliens", "es": "los arrecifes de coral",
                    "de": "Korallenriffe", "it": "le barriere coralline", "pt": "os recifes de coral",
                    "nl": "koraalriffen"},
    "mushrooms": {"en": "mushrooms", "fr": "les champignons", "es": "los hongos", "de": "Pilze",
                  "it": "i funghi", "pt": "os cogumelos", "nl": "paddenstoelen"},
    "spices": {"en": "spices", "fr": "les épices", "es": "las especias", "de": "Gewürze",
               "it": "le spezie", "pt": "as especiarias", "nl": "specerijen"},
    "olive_oil": {"en": "olive oil", "fr": "l'huile d'olive", "es": "el aceite de oliva",
                  "de": "Olivenöl", "it": "l'olio d'oliva", "pt": "o azeite", "nl": "olijfolie"},
    "fireworks": {"en": "fireworks", "fr": "les feux d'artifice", "es": "los fuegos artificiales",
                  "de": "Feuerwerk", "it": "i fuochi d'artificio", "pt": "os fogos de artifício",
                  "nl": "vuurwerk"},
    "autumn": {"en": "autumn", "fr": "l'automne", "es": "el otoño", "de": "der Herbst",
               "it": "l'autunno", "pt": "o outono", "nl": "de herfst"},
    "birthdays": {"en": "birthdays", "fr": "les anniversaires", "es": "los cumpleaños",
                  "de": "Geburtstage", "it": "i compleanni", "pt": "os aniversários",
                  "nl": "verjaardagen"},
    "clouds": {"en": "clouds", "fr": "les nuages", "es": "las nubes", "de": "Wolken",
               "it": "le nuvole", "pt": "as nuvens", "nl": "wolken"},
    "sharks": {"en": "sharks", "fr": "les requins", "es": "los tiburones", "de": "Haie",
               "it": "gli squali", "pt": "os tubarões", "nl": "haaien"},
}

# Whole words (matched case-insensitively, as the `contains_any` check does) that show a text is
# about the topic: singular and plural, plus the German genitive and dative forms that a reply in
# running text produces ("des Ozeans", "von Vulkanen"), because a whole-word match misses them.
TOPIC_KEYWORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "ocean": {"en": ("ocean", "oceans"), "fr": ("océan", "océans"), "es": ("océano", "océanos"),
              "de": ("Ozean", "Ozeans", "Ozeane", "Ozeanen"), "it": ("oceano", "oceani"),
              "pt": ("oceano", "oceanos"), "nl": ("oceaan", "oceanen")},
    "music": {"en": ("music",), "fr": ("musique",), "es": ("música",), "de": ("Musik",),
              "it": ("musica",), "pt": ("música",), "nl": ("muziek",)},
    "coffee": {"en": ("coffee",), "fr": ("café",), "es": ("café",), "de": ("Kaffee", "Kaffees"),
               "it": ("caffè",), "pt": ("café",), "nl": ("koffie",)},
    "volcanoes": {"en": ("volcano", "volcanoes"), "fr": ("volcan", "volcans"),
                  "es": ("volcán", "volcanes"), "de": ("Vulkan", "Vulkans", "Vulkane", "Vulkanen"),
                  "it": ("vulcano", "vulcani"), "pt": ("vulcão", "vulcões"),
                  "nl": ("vulkaan", "vulkanen")},
    "moon": {"en": ("moon",), "fr": ("lune",), "es": ("luna",), "de": ("Mond", "Mondes", "Monds"),
             "it": ("luna",), "pt": ("lua",), "nl": ("maan",)},
    "rainforests": {"en": ("rainforest", "rainforests"),
                    "fr": ("forêt tropicale", "forêts tropicales"),
                    "es": ("selva tropical", "selvas tropicales", "selva", "selvas"),
                    "de": ("Regenwald", "Regenwaldes", "Regenwalds", "Regenwälder", "Regenwäldern"),
                    "it": ("foresta pluviale", "foreste pluviali", "foresta tropicale",
                           "foreste tropicali"),
                    "pt": ("floresta tropical", "florestas tropicais"),
                    "nl": ("regenwoud", "regenwouden")},
    "dolphins": {"en": ("dolphin", "dolphins"), "fr": ("dauphin", "dauphins"),
                 "es": ("delfín", "delfines"), "de": ("Delfin", "Delfins", "Delfine", "Delfinen"),
                 "it": ("delfino", "delfini"), "pt": ("golfinho", "golfinhos"),
                 "nl": ("dolfijn", "dolfijnen")},
    "dinosaurs": {"en": ("dinosaur", "dinosaurs"), "fr": ("dinosaure", "dinosaures"),
                  "es": ("dinosaurio", "dinosaurios"), "de": ("Dinosaurier", "Dinosauriern"),
                  "it": ("dinosauro", "dinosauri"), "pt": ("dinossauro", "dinossauros"),
                  "nl": ("dinosaurus", "dinosaurussen", "dinosauriërs")},
    "chocolate": {"en": ("chocolate",), "fr": ("chocolat",), "es": ("chocolate",),
                  "de": ("Schokolade",), "it": ("cioccolato", "cioccolata"), "pt": ("chocolate",),
                  "nl": ("chocolade",)},
    "cheese": {"en": ("cheese", "cheeses"), "fr": ("fromage", "fromages"), "es": ("queso", "quesos"),
               "de": ("Käse",), "it": ("formaggio", "formaggi"), "pt": ("queijo", "queijos"),
               "nl": ("kaas", "kazen")},
    "rivers": {"en": ("river", "rivers"), "fr": ("rivière", "rivières", "fleuve", "fleuves"),
               "es": ("río", "ríos"), "de": ("Fluss", "Flusses", "Flüsse", "Flüssen"),
               "it": ("fiume", "fiumi"), "pt": ("rio", "rios"), "nl": ("rivier", "rivieren")},
    "mountains": {"en": ("mountain", "mountains"), "fr": ("montagne", "montagnes"),
                  "es": ("montaña", "montañas"), "de": ("Berg", "Berges", "Bergs", "Berge", "Bergen"),
                  "it": ("montagna", "montagne"), "pt": ("montanha", "montanhas"),
                  "nl": ("berg", "bergen")},
    "deserts": {"en": ("desert", "deserts"), "fr": ("désert", "déserts"),
                "es": ("desierto", "desiertos"), "de": ("Wüste", "Wüsten"),
                "it": ("deserto", "deserti"), "pt": ("deserto", "desertos"),
                "nl": ("woestijn", "woestijnen")},
    "glaciers": {"en": ("glacier", "glaciers"), "fr": ("glacier", "glaciers"),
                 "es": ("glaciar", "glaciares"), "de": ("Gletscher", "Gletschers", "Gletschern"),
                 "it": ("ghiacciaio", "ghiacciai"),
                 "pt": ("glaciar", "glaciares", "geleira", "geleiras"),
                 "nl": ("gletsjer", "gletsjers")},
    "rainbows": {"en": ("rainbow", "rainbows"), "fr": ("arc-en-ciel", "arcs-en-ciel"),
                 "es": ("arcoíris", "arco iris"),
                 "de": ("Regenbogen", "Regenbogens", "Regenbögen"),
                 "it": ("arcobaleno", "arcobaleni"), "pt": ("arco-íris",),
                 "nl": ("regenboog", "regenbogen")},
    "solar_system": {"en": ("solar system",), "fr": ("système solaire",), "es": ("sistema solar",),
                     "de": ("Sonnensystem", "Sonnensystems"), "it": ("sistema solare",),
                     "pt": ("sistema solar",), "nl": ("zonnestelsel",)},
    "universe": {"en": ("universe",), "fr": ("univers",), "es": ("universo",),
                 "de": ("Universum", "Universums", "Weltall", "Weltalls"), "it": ("universo",),
                 "pt": ("universo",), "nl": ("heelal", "universum")},
    "comets": {"en": ("comet", "comets"), "fr": ("comète", "comètes"), "es": ("cometa", "cometas"),
               "de": ("Komet", "Kometen"), "it": ("cometa", "comete"), "pt": ("cometa", "cometas"),
               "nl": ("komeet", "kometen")},
    "electricity": {"en": ("electricity",), "fr": ("électricité",), "es": ("electricidad",),
                    "de": ("Elektrizität",), "it": ("elettricità",),
                    "pt": ("eletricidade",), "nl": ("elektriciteit",)},
    "libraries": {"en": ("library", "libraries"), "fr": ("bibliothèque", "bibliothèques"),
                  "es": ("biblioteca", "bibliotecas"), "de": ("Bibliothek", "Bibliotheken"),
                  "it": ("biblioteca", "biblioteche"), "pt": ("biblioteca", "bibliotecas"),
                  "nl": ("bibliotheek", "bibliotheken")},
    "museums": {"en": ("museum", "museums"), "fr": ("musée", "musées"), "es": ("museo", "museos"),
                "de": ("Museum", "Museums", "Museen"), "it": ("museo", "musei"),
                "pt": ("museu", "museus"), "nl": ("museum", "musea", "museums")},
    "bridges": {"en": ("bridge", "bridges"), "fr": ("pont", "ponts"), "es": ("puente", "puentes"),
                "de": ("Brücke", "Brücken"), "it": ("ponte", "ponti"), "pt": ("ponte", "pontes"),
                "nl": ("brug", "bruggen")},
    "castles": {"en": ("castle", "castles"),
                "fr": ("château", "châteaux", "château fort", "châteaux forts"),
                "es": ("castillo", "castillos"),
                "de": ("Burg", "Burgen", "Schloss", "Schlosses", "Schlösser", "Schlössern"),
                "it": ("castello", "castelli"), "pt": ("castelo", "castelos"),
                "nl": ("kasteel", "kastelen")},
    "pyramids": {"en": ("pyramid", "pyramids"), "fr": ("pyramide", "pyramides"),
                 "es": ("pirámide", "pirámides"), "de": ("Pyramide", "Pyramiden"),
                 "it": ("piramide", "piramidi"), "pt": ("pirâmide", "pirâmides"),
                 "nl": ("piramide", "piramides")},
    "clocks": {"en": ("clock", "clocks"), "fr": ("horloge", "horloges"), "es": ("reloj", "relojes"),
               "de": ("Uhr", "Uhren"), "it": ("orologio", "orologi"),
               "pt": ("relógio", "relógios"), "nl": ("klok", "klokken")},
    "honey": {"en": ("honey",), "fr": ("miel",), "es": ("miel",), "de": ("Honig", "Honigs"),
              "it": ("miele",), "pt": ("mel",), "nl": ("honing",)},
    "apples": {"en": ("apple", "apples"), "fr": ("pomme", "pommes"), "es": ("manzana", "manzanas"),
               "de": ("Apfel", "Apfels", "Äpfel", "Äpfeln"), "it": ("mela", "mele"),
               "pt": ("maçã", "maçãs"), "nl": ("appel", "appels")},
    "soup": {"en": ("soup", "soups"), "fr": ("soupe", "soupes"), "es": ("sopa", "sopas"),
             "de": ("Suppe", "Suppen"), "it": ("zuppa", "zuppe"), "pt": ("sopa", "sopas"),
             "nl": ("soep", "soepen")},
    "brain": {"en": ("brain", "brains"), "fr": ("cerveau", "cerveaux"), "es": ("cerebro", "cerebros"),
              "de": ("Gehirn", "Gehirns", "Gehirne"), "it": ("cervello", "cervelli"),
              "pt": ("cérebro", "cérebros"), "nl": ("hersenen", "brein")},
    "dreams": {"en": ("dream", "dreams"), "fr": ("rêve", "rêves"), "es": ("sueño", "sueños"),
               "de": ("Traum", "Traums", "Träume", "Träumen"), "it": ("sogno", "sogni"),
               "pt": ("sonho", "sonhos"), "nl": ("droom", "dromen")},
    "lighthouses": {"en": ("lighthouse", "lighthouses"), "fr": ("phare", "phares"),
                    "es": ("faro", "faros"),
                    "de": ("Leuchtturm", "Leuchtturms", "Leuchttürme", "Leuchttürmen"),
                    "it": ("faro", "fari"), "pt": ("farol", "faróis"),
                    "nl": ("vuurtoren", "vuurtorens")},
    "butterflies": {"en": ("butterfly", "butterflies"), "fr": ("papillon", "papillons"),
                    "es": ("mariposa", "mariposas"),
                    "de": ("Schmetterling", "Schmetterlings", "Schmetterlinge", "Schmetterlingen"),
                    "it": ("farfalla", "farfalle"), "pt": ("borboleta", "borboletas"),
                    "nl": ("vlinder", "vlinders")},
    "owls": {"en": ("owl", "owls"), "fr": ("chouette", "chouettes", "hibou", "hiboux"),
             "es": ("búho", "búhos", "lechuza", "lechuzas"), "de": ("Eule", "Eulen"),
             "it": ("gufo", "gufi", "civetta", "civette"), "pt": ("coruja", "corujas"),
             "nl": ("uil", "uilen")},
    "elephants": {"en": ("elephant", "elephants"), "fr": ("éléphant", "éléphants"),
                  "es": ("elefante", "elefantes"), "de": ("Elefant", "Elefanten"),
                  "it": ("elefante", "elefanti"), "pt": ("elefante", "elefantes"),
                  "nl": ("olifant", "olifanten")},
    "whales": {"en": ("whale", "whales"), "fr": ("baleine", "baleines"),
               "es": ("ballena", "ballenas"), "de": ("Wal", "Wals", "Wale", "Walen"),
               "it": ("balena", "balene"), "pt": ("baleia", "baleias"),
               "nl": ("walvis", "walvissen")},
    "penguins": {"en": ("penguin", "penguins"),
                 "fr": ("manchot", "manchots", "pingouin", "pingouins"),
                 "es": ("pingüino", "pingüinos"), "de": ("Pinguin", "Pinguins", "Pinguine", "Pinguinen"),
                 "it": ("pinguino", "pinguini"), "pt": ("pinguim", "pinguins"),
                 "nl": ("pinguïn", "pinguïns")},
    "islands": {"en": ("island", "islands"), "fr": ("île", "îles"), "es": ("isla", "islas"),
                "de": ("Insel", "Inseln"), "it": ("isola", "isole"), "pt": ("ilha", "ilhas"),
                "nl": ("eiland", "eilanden")},
    "earthquakes": {"en": ("earthquake", "earthquakes"),
                    "fr": ("tremblement de terre", "tremblements de terre", "séisme", "séismes"),
                    "es": ("terremoto", "terremotos", "sismo", "sismos"),
                    "de": ("Erdbeben", "Erdbebens"), "it": ("terremoto", "terremoti"),
                    "pt": ("terremoto", "terremotos", "sismo", "sismos"),
                    "nl": ("aardbeving", "aardbevingen")},
    "snow": {"en": ("snow",), "fr": ("neige",), "es": ("nieve",), "de": ("Schnee", "Schnees"),
             "it": ("neve",), "pt": ("neve",), "nl": ("sneeuw",)},
    "gravity": {"en": ("gravity",), "fr": ("gravité", "pesanteur"), "es": ("gravedad",),
                "de": ("Schwerkraft", "Gravitation"), "it": ("gravità",), "pt": ("gravidade",),
                "nl": ("zwaartekracht",)},
    "photosynthesis": {"en": ("photosynthesis",), "fr": ("photosynthèse",), "es": ("fotosíntesis",),
                       "de": ("Photosynthese", "Fotosynthese"), "it": ("fotosintesi",),
                       "pt": ("fotossíntese",), "nl": ("fotosynthese",)},
    "roman_empire": {"en": ("Roman Empire",), "fr": ("Empire romain",), "es": ("Imperio romano",),
                     "de": ("Römische Reich", "Römischen Reich", "Römischen Reiches",
                            "Römischen Reichs"),
                     "it": ("Impero romano",), "pt": ("Império Romano",), "nl": ("Romeinse Rijk",)},
    "ancient_egypt": {"en": ("Egypt",), "fr": ("Égypte",), "es": ("Egipto",),
                      "de": ("Ägypten", "Ägyptens"), "it": ("Egitto",), "pt": ("Egito", "Egipto"),
                      "nl": ("Egypte",)},
    "vikings": {"en": ("Viking", "Vikings"), "fr": ("Viking", "Vikings"),
                "es": ("vikingo", "vikingos"), "de": ("Wikinger", "Wikingern"),
                "it": ("vichingo", "vichinghi"), "pt": ("viking", "vikings"),
                "nl": ("Viking", "Vikingen")},
    "fairy_tales": {"en": ("fairy tale", "fairy tales"), "fr": ("conte de fées", "contes de fées"),
                    "es": ("cuento de hadas", "cuentos de hadas"), "de": ("Märchen", "Märchens"),
                    "it": ("fiaba", "fiabe"), "pt": ("conto de fadas", "contos de fadas"),
                    "nl": ("sprookje", "sprookjes")},
    "airplanes": {"en": ("airplane", "airplanes", "aeroplane", "aeroplanes"),
                  "fr": ("avion", "avions"), "es": ("avión", "aviones"),
                  "de": ("Flugzeug", "Flugzeugs", "Flugzeuge", "Flugzeugen"),
                  "it": ("aereo", "aerei"), "pt": ("avião", "aviões"),
                  "nl": ("vliegtuig", "vliegtuigen")},
    "submarines": {"en": ("submarine", "submarines"), "fr": ("sous-marin", "sous-marins"),
                   "es": ("submarino", "submarinos"), "de": ("U-Boot", "U-Boots", "U-Boote", "U-Booten"),
                   "it": ("sottomarino", "sottomarini"), "pt": ("submarino", "submarinos"),
                   "nl": ("onderzeeër", "onderzeeërs")},
    "coral_reefs": {"en": ("coral reef", "coral reefs"),
                    "fr": ("récif corallien", "récifs coralliens"),
                    "es": ("arrecife de coral", "arrecifes de coral"),
                    "de": ("Korallenriff", "Korallenriffs", "Korallenriffe", "Korallenriffen"),
                    "it": ("barriera corallina", "barriere coralline", "scogliera corallina",
                           "scogliere coralline"),
                    "pt": ("recife de coral", "recifes de coral"),
                    "nl": ("koraalrif", "koraalriffen")},
    "mushrooms": {"en": ("mushroom", "mushrooms"), "fr": ("champignon", "champignons"),
                  "es": ("hongo", "hongos", "seta", "setas"), "de": ("Pilz", "Pilze", "Pilzen"),
                  "it": ("fungo", "funghi"), "pt": ("cogumelo", "cogumelos"),
                  "nl": ("paddenstoel", "paddenstoelen")},
    "spices": {"en": ("spice", "spices"), "fr": ("épice", "épices"), "es": ("especia", "especias"),
               "de": ("Gewürz", "Gewürze", "Gewürzen"), "it": ("spezia", "spezie"),
               "pt": ("especiaria", "especiarias"), "nl": ("specerij", "specerijen")},
    "olive_oil": {"en": ("olive oil",), "fr": ("huile d'olive",), "es": ("aceite de oliva",),
                  "de": ("Olivenöl", "Olivenöls"), "it": ("olio d'oliva", "olio di oliva"),
                  "pt": ("azeite",), "nl": ("olijfolie",)},
    "fireworks": {"en": ("firework", "fireworks"), "fr": ("feu d'artifice", "feux d'artifice"),
                  "es": ("fuegos artificiales",), "de": ("Feuerwerk", "Feuerwerks", "Feuerwerke"),
                  "it": ("fuochi d'artificio",), "pt": ("fogos de artifício",),
                  "nl": ("vuurwerk",)},
    "autumn": {"en": ("autumn",), "fr": ("automne",), "es": ("otoño",), "de": ("Herbst", "Herbstes"),
               "it": ("autunno",), "pt": ("outono",), "nl": ("herfst",)},
    "birthdays": {"en": ("birthday", "birthdays"), "fr": ("anniversaire", "anniversaires"),
                  "es": ("cumpleaños",), "de": ("Geburtstag", "Geburtstags", "Geburtstage", "Geburtstagen"),
                  "it": ("compleanno", "compleanni"), "pt": ("aniversário", "aniversários"),
                  "nl": ("verjaardag", "verjaardagen")},
    "clouds": {"en": ("cloud", "clouds"), "fr": ("nuage", "nuages"), "es": ("nube", "nubes"),
               "de": ("Wolke", "Wolken"), "it": ("nuvola", "nuvole"), "pt": ("nuvem", "nuvens"),
               "nl": ("wolk", "wolken")},
    "sharks": {"en": ("shark", "sharks"), "fr": ("requin", "requins"),
               "es": ("tiburón", "tiburones"), "de": ("Hai", "Haie", "Haien"),
               "it": ("squalo", "squali"), "pt": ("tubarão", "tubarões"),
               "nl": ("haai", "haaien")},
}


@dataclass(frozen=True)
class UserTurn:
    """One user message, with the TOPICS key it is about (None for a user's own message)."""

    text: str
    topic: str | None


# The slot receives TOPICS[topic]["en"] as it stands ("the ocean", "volcanoes", "coffee"), so it
# always sits after a verb or preposition, never opens a sentence, is never the subject of a
# conjugated verb and is never referred back to by a pronoun: singular, plural and mass topics
# all read grammatically.
PHRASINGS: tuple[str, ...] = (
    "Tell me about {topic}.",
    "What do you know about {topic}?",
    "I've been reading about {topic} lately. Thoughts?",
    "Can you explain {topic} to a child?",
    "Give me three fun facts about {topic}.",
    "What's the most surprising thing about {topic}?",
    "I'm writing a school report on {topic}. Where should I start?",
    "What are some common misconceptions about {topic}?",
    "How would you describe {topic} in a few sentences?",
    "I know almost nothing about {topic}. Could you give me an overview?",
    "What questions would you ask an expert on {topic}?",
    "Share something interesting about {topic}, please.",
    "If you taught a class on {topic}, what would the first lesson cover?",
    "I just watched a documentary about {topic}. What else should I know?",
    "Why are so many people curious about {topic}?",
    "Write a short paragraph about {topic}.",
    "Which facts about {topic} would impress my friends?",
    "How can I learn more about {topic}?",
    "I'm curious about {topic}. Where do I begin?",
    "What's one thing everyone should know about {topic}?",
    "My little sister keeps asking me about {topic}. What should I tell her?",
    "Let's talk about {topic} for a bit.",
    "Could you give me a quick introduction to {topic}?",
    "What makes {topic} so fascinating?",
    "I was thinking about {topic} on my walk today. What's worth knowing?",
)


def _user_turn(phrasing: str, topic: str) -> UserTurn:
    return UserTurn(text=phrasing.format(topic=TOPICS[topic]["en"]), topic=topic)


def all_user_turns() -> list[UserTurn]:
    """Every distinct built-in message (topics x phrasings), in a fixed order; at least 500 distinct texts."""
    return [_user_turn(phrasing, topic) for topic in TOPICS for phrasing in PHRASINGS]


def split_user_turns(heldout_fraction: float = 0.2, seed: int = 0) -> tuple[list[UserTurn], list[UserTurn]]:
    """Split all_user_turns() by (phrasing, topic) pair into (train, held-out); every topic is on both sides."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be strictly between 0 and 1, got {heldout_fraction}")
    # Each topic holds out the same number of phrasings, at least one and never all of them.
    n_heldout = min(max(round(heldout_fraction * len(PHRASINGS)), 1), len(PHRASINGS) - 1)
    heldout_pairs: set[tuple[str, str]] = set()
    for topic in TOPICS:
        # A per-topic generator keeps a topic's split unchanged when other topics are added.
        rng = random.Random(f"{seed}:{topic}")
        heldout_pairs.update((phrasing, topic) for phrasing in rng.sample(PHRASINGS, n_heldout))
    train: list[UserTurn] = []
    heldout: list[UserTurn] = []
    for topic in TOPICS:
        for phrasing in PHRASINGS:
            side = heldout if (phrasing, topic) in heldout_pairs else train
            side.append(_user_turn(phrasing, topic))
    return train, heldout


def _repeat_key(turn: UserTurn) -> str:
    # A user's own messages have no topic, so for them it is the message itself that must not recur.
    return f"topic:{turn.topic}" if turn.topic is not None else f"text:{turn.text}"


def _allowed(pool: Sequence[UserTurn], recent: list[str]) -> list[UserTurn]:
    # A pool with fewer topics than the window cannot honour it; forget the oldest topics first.
    window = list(recent)
    while True:
        allowed = [turn for turn in pool if _repeat_key(turn) not in window]
        if allowed or not window:
            return allowed
        window.pop(0)


def sample_user_turns(
    n: int, seed: int, *, exclude_recent: int = 4, pool: Sequence[UserTurn] | None = None
) -> list[UserTurn]:
    """n messages drawn from `seed` (default pool: all); no topic recurs within `exclude_recent` turns."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if exclude_recent < 0:
        raise ValueError(f"exclude_recent must be >= 0, got {exclude_recent}")
    turns = list(pool) if pool is not None else all_user_turns()
    if not turns:
        raise ValueError("cannot sample user turns from an empty pool")
    rng = random.Random(seed)
    recent: list[str] = []
    sampled: list[UserTurn] = []
    for _ in range(n):
        turn = rng.choice(turns)
        if _repeat_key(turn) in recent:
            # Redrawing among the allowed turns only keeps the draw uniform over them, and the
            # full scan happens only on the rare collision.
            turn = rng.choice(_allowed(turns, recent))
        sampled.append(turn)
        if exclude_recent:
            recent = (recent + [_repeat_key(turn)])[-exclude_recent:]
    return sampled


# A user's own dialogues: read and validated by gatt.dialogues, shared with the evaluation.


def on_topic_check(topic: str) -> Check:
    """A `contains_any` check passed by a reply that names `topic` in any language (keywords, first seen kept)."""
    # The keywords, not the noun phrases ("the ocean"): a real model writes "oceans" or "im Ozean"
    # as often as the article form, and every noun phrase contains its own keyword anyway.
    # Keyed by casefold because the check ignores case: "Viking" (en, fr, nl) is one word.
    words: dict[str, str] = {}
    for language in LANGUAGE_CODES:
        for word in TOPIC_KEYWORDS[topic][language]:
            words.setdefault(word.casefold(), word)
    return Check("contains_any", {"words": list(words.values())})


def load_user_turns(path: str | Path, *, on_error: OnError = "raise") -> list[UserTurn]:
    """User messages of a dialogue file or a .txt file (one a line), in order, deduplicated, topic None."""
    return [UserTurn(text=text, topic=None) for text in load_user_texts(path, on_error=on_error)]
