"""Regenerate `intents.jsonl`: labelled prompts for the intent classifier (deterministic).

    python tools/routing/data/make_intents.py

Each line: {"text", "label", "group"}. `group` names the template a prompt came from (or
`hand-<n>` for a hand-written one); the train script holds out whole groups, so the reported
accuracy is on phrasings the model never saw, not on re-filled copies of training templates.
Labels: `simple` (one-step facts, lookups, small talk: the fast tier can answer), `complex`
(multi-step reasoning, analysis, long-form writing, planning: the quality tier), `code`.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

PER_TEMPLATE = 6

S = {
    "country": ["France", "Japan", "Kenya", "Peru", "Canada", "Norway", "Egypt", "Vietnam", "Chile", "Poland"],
    "book": ["Pride and Prejudice", "1984", "Moby-Dick", "Don Quixote", "Beloved", "The Trial", "Dune"],
    "unit_pair": ["centimetres in a metre", "minutes in an hour", "grams in a kilogram", "days in a leap year",
                  "ounces in a pound", "seconds in a day", "bits in a byte"],
    "word": ["cat", "library", "thank you", "window", "bread", "friend", "river", "good night"],
    "language": ["Spanish", "German", "Italian", "Japanese", "French", "Portuguese", "Dutch"],
    "animal": ["a dolphin", "a bat", "a penguin", "a shark", "a whale", "an octopus", "a platypus"],
    "n": [str(x) for x in (7, 12, 15, 21, 29, 37, 48, 51, 64, 97, 101, 143)],
    "term": ["photosynthesis", "inflation", "gravity", "a noun", "a haiku", "osmosis", "democracy", "an atom"],
    "event": ["the moon landing", "the fall of the Berlin Wall", "the French Revolution", "World War I",
              "the invention of the printing press", "the Great Depression"],
    "adj": ["happy", "fast", "big", "angry", "smart", "tiny", "brave"],
    "review": ["I loved every minute of it", "The food was cold and bland", "Terrible service, never again",
               "Absolutely fantastic experience", "It broke after two days", "Best purchase this year"],
    "element": ["gold", "sodium", "iron", "oxygen", "potassium", "silver", "helium"],
    "painting": ["the Mona Lisa", "The Starry Night", "Guernica", "The Scream", "Girl with a Pearl Earring"],
    "noun": ["mouse", "child", "cactus", "goose", "analysis", "tooth"],
    "city": ["Paris", "Tokyo", "Nairobi", "Lima", "Toronto", "Sydney", "Berlin", "Mumbai"],
    "genre": ["comedy", "horror", "science fiction", "documentary", "romantic"],
    "misspelled": ["recieve", "definately", "seperate", "occured", "wierd", "accomodate"],
    "largest": ["planet in the solar system", "ocean on Earth", "desert in the world", "country by area", "organ in the human body"],
    "tech_pair": ["PostgreSQL and MongoDB", "Kafka and RabbitMQ", "Kubernetes and Nomad", "REST and gRPC",
                  "monoliths and microservices", "Redis and Memcached", "NATS and Kafka"],
    "use_case": ["a payments platform", "an analytics pipeline", "a chat application", "an IoT fleet",
                 "a multi-tenant SaaS product", "a mobile game backend"],
    "topic": ["climate change", "the history of the internet", "remote work", "urbanization", "antibiotic resistance",
              "the future of public transport", "social media and democracy"],
    "process": ["a vaccine trains the immune system", "TCP establishes a connection", "a bill becomes law",
                "a bank creates money through lending", "photosynthesis produces glucose", "public-key cryptography secures a website"],
    "system": ["URL shortener", "ride-sharing dispatch service", "video streaming platform", "rate limiter",
               "distributed job scheduler", "notification service"],
    "scale": ["ten million users a day", "50,000 requests per second", "a billion events per day", "global traffic across three regions"],
    "goal": ["cut cloud spending by 30%", "launch a product in a new market", "reduce employee turnover",
             "migrate our data center to the cloud", "improve customer satisfaction scores"],
    "policy": ["a four-day work week", "universal basic income", "congestion pricing", "banning single-use plastics",
               "raising the minimum wage"],
    "change": ["interest rates doubled overnight", "the internet went down for a week", "every car became electric",
               "bees disappeared", "remote work became mandatory"],
    "option_pair": ["renting and buying a home", "a startup job and a big-company job", "learning Rust and learning Go",
                    "an MBA and a master's in computer science", "leasing and buying a car"],
    "prio": ["low risk, flexibility", "long-term growth, stability", "cost, time to market", "salary, work-life balance"],
    "argument": ["Everyone I know likes it, so it must be good", "Crime rose after the new mayor took office, so the mayor caused it",
                 "If we allow this, soon everything will be allowed", "He is not an expert, so his argument is wrong"],
    "concept_pair": ["weather and climate", "correlation and causation", "stocks and bonds", "virus and bacteria",
                     "precision and recall", "fiscal and monetary policy"],
    "subject": ["linear algebra", "machine learning", "Spanish", "organic chemistry", "music theory", "statistics"],
    "fermi": ["piano tuners", "gas stations", "dentists", "coffee shops", "elevators"],
    "data": ["sales of 120, 135, 90, 160 over four quarters", "signups of 40, 80, 75, 300 after each campaign",
             "latency of 80 ms, 85 ms, 400 ms, 90 ms over four days"],
    "constraints": ["two small children and a limited budget", "a wheelchair user", "a vegetarian diet and little time"],
    "lang": ["Python", "JavaScript", "Go", "Rust", "Java", "TypeScript", "C++", "Ruby"],
    "task": ["reverses a linked list", "checks whether a string is a palindrome", "merges two sorted arrays",
             "computes the nth Fibonacci number", "removes duplicates from a list", "parses an ISO date",
             "flattens a nested dictionary", "counts word frequencies in a file"],
    "sql_task": ["returns the top five customers by total order value", "finds duplicate email addresses",
                 "counts orders per month in 2023", "joins users to their latest login"],
    "regex_task": ["a valid IPv4 address", "an email address", "a hex colour code", "a date in YYYY-MM-DD format"],
    "git_task": ["undo my last commit", "rename a branch", "squash three commits", "resolve a merge conflict", "cherry-pick a commit"],
    "error": ["TypeError: 'NoneType' object is not subscriptable", "NullPointerException", "segmentation fault",
              "ModuleNotFoundError: No module named 'requests'", "undefined is not a function", "borrowed value does not live long enough"],
    "ds": ["stack", "LRU cache", "binary search tree", "priority queue", "trie"],
    "shell_task": ["find all files larger than 100MB", "count lines in every .py file", "kill the process on port 8080",
                   "replace foo with bar in all .txt files"],
    "fmt": ["CSV", "JSON", "YAML", "Parquet"],
    "framework": ["Flask", "FastAPI", "Express", "Spring Boot", "Django"],
    "endpoint_task": ["returns a list of users", "uploads a file", "creates an order", "deletes a comment by id"],
    "api_pair": ["map and flatMap", "== and is", "let and const", "malloc and calloc", "async and threads", "list and tuple"],
    "ui_task": ["shows a paginated table", "renders a login form with validation", "displays a countdown timer", "toggles dark mode"],
    "script_task": ["renames all photos by date", "backs up a directory every night", "downloads a web page and extracts links",
                    "monitors CPU usage and logs it"],
    "snippet": [
        "def add(a, b):\n    return a - b",
        "for i in range(len(items)):\n    if items[i] = target:\n        return i",
        "function sum(arr) {\n  let total;\n  arr.forEach(x => total += x);\n  return total;\n}",
        "int main() {\n  int *p;\n  *p = 5;\n  printf(\"%d\", *p);\n}",
        "SELECT name, COUNT(*) FROM users WHERE COUNT(*) > 1 GROUP BY name;",
        "while True:\n    line = f.readline()\n    print(line)",
        "const x = await fetch(url)\nconsole.log(x.json().data)",
    ],
}

SIMPLE = [
    "What is the capital of {country}?", "Who wrote {book}?", "How many {unit_pair}?",
    "Translate '{word}' into {language}.", "Is {animal} a mammal?", "Is {n} a prime number?",
    "Define {term} in one sentence.", "When did {event} happen?", "Give me a synonym for '{adj}'.",
    "Classify the sentiment of this review as positive or negative: '{review}'",
    "What is the chemical symbol for {element}?", "Who painted {painting}?", "What is the plural of '{noun}'?",
    "Which continent is {country} in?", "What time zone is {city} in?", "Recommend a good {genre} movie.",
    "Correct the spelling: '{misspelled}'", "What is the largest {largest}?", "what's {n} plus {n}",
    "hey, quick one: what currency does {country} use?", "Tell me a fun fact about {animal}.",
    "How do you say '{word}' in {language}?", "What's the population of {city}, roughly?",
    "Spell '{adj}' backwards.", "thanks! and what's the opposite of {adj}?",
    "{greeting} {smalltalk}", "{ack}, {smalltalk}",
]

COMPLEX = [
    "Compare {tech_pair} for {use_case}, and explain the trade-offs in cost, latency and operability.",
    "Write a detailed essay on {topic}, covering its history, current state and future outlook.",
    "Explain step by step how {process}, and why each step is necessary.",
    "Design a {system} that can handle {scale}. Describe the components, data flow and failure modes.",
    "Analyze the causes and consequences of {event}, and evaluate which factor mattered most.",
    "I lead a team of {n} people. Create a plan to {goal}, with milestones, risks and how we will measure success.",
    "Summarize the arguments for and against {policy}, then give a balanced recommendation.",
    "What would happen to the economy if {change}? Reason through the second-order effects.",
    "Help me decide between {option_pair}: list the pros and cons, weigh them against my priorities ({prio}) and recommend one.",
    "Critique the following argument and identify its logical flaws: '{argument}'",
    "Explain the differences between {concept_pair}, give examples of when each applies, and discuss common misconceptions.",
    "Outline a {n}-week study plan to learn {subject}, with weekly goals, resources and checkpoints.",
    "Estimate how many {fermi} there are in {city}. Walk through your assumptions one by one.",
    "Given the following data: {data}, what trends do you see, and what might explain them?",
    "Plan a {n}-day trip to {city} for a family with {constraints}, balancing cost, travel time and interests.",
    "First summarize the causes of {event}, then compare them with the causes of another major upheaval, and finally argue which had the larger long-term impact.",
    "Evaluate the ethical implications of using AI in {use_case}. Consider privacy, fairness and accountability.",
    "What are the long-term risks of {goal_ing} for a mid-sized company, and how could each be mitigated?",
    "A tank fills at {n} litres per minute and drains at 3 litres per minute. It starts with 40 litres. How long until it holds 200 litres, and what changes if the drain rate doubles after 10 minutes? Show each step.",
    "Our {system} is slow at peak hours. Walk me through how you would diagnose the bottleneck, which metrics you would look at, and what fixes you would try in which order.",
    "why might {event} have turned out differently? think about the economic, social and political factors and how they interacted",
    "Write a persuasive op-ed arguing for {policy}, anticipating the three strongest objections and rebutting each.",
    "Teach me {subject} from scratch: start with the core intuitions, then build up to the main results, with an example at each stage.",
    "Prove that there are infinitely many prime numbers, and then explain why the same argument does not work for twin primes.",
    "Assess whether {tech_pair} would suit {use_case} over the next five years, considering hiring, vendor lock-in and scaling costs.",
]

CODE = [
    "Write a {lang} function that {task}.", "Fix the bug in this code:\n```\n{snippet}\n```",
    "What does this code do?\n{snippet}", "Write a SQL query that {sql_task}.",
    "Write a regular expression that matches {regex_task}.", "How do I {git_task} with git?",
    "Why do I get `{error}` when I run my {lang} program?", "Write pytest unit tests for a function that {task}.",
    "Implement a {ds} class in {lang} with insert, delete and lookup methods.",
    "Write a bash one-liner to {shell_task}.", "How do I read a {fmt} file in {lang}?",
    "Create a REST endpoint in {framework} that {endpoint_task}.", "What's the time complexity of this?\n{snippet}",
    "Write a Dockerfile for a {framework} app.", "Explain the difference between `{api_pair}` in {lang}.",
    "Write a React component that {ui_task}.", "Write a {lang} script that {script_task}.",
    "Port this to {lang}:\n{snippet}", "refactor this so it's readable and add type hints:\n{snippet}",
    "my {lang} code crashes with {error}, here's the snippet: {snippet}",
    "Give me a {lang} class for a {ds} and show how to use it.", "Optimize this loop, it is too slow:\n{snippet}",
    "Write a GitHub Actions workflow that runs {lang} tests on every push.",
    "How can I {task_verb} in {lang} without external libraries?",
    "Add error handling and logging to this function:\n{snippet}",
]

S["greeting"] = ["hi", "hello!", "hey there,", "good evening", "morning!", "hi again", "yo"]
S["smalltalk"] = ["how are you?", "thanks for your help earlier", "hope you're well", "just checking in",
                  "nice to meet you", "thank you so much", "you were a big help yesterday", "have a nice day"]
S["ack"] = ["ok thanks", "great", "got it", "perfect", "cool", "sounds good", "thank you"]
S["goal_ing"] = ["cutting cloud spending aggressively", "expanding into a new market", "outsourcing customer support",
                 "moving everything to microservices", "relying on a single supplier"]
S["task_verb"] = ["reverse a linked list", "check whether a string is a palindrome", "merge two sorted arrays",
                  "remove duplicates from a list", "parse an ISO date", "flatten a nested dictionary"]

HAND = {
    "simple": [
        "Hello!", "good morning :)", "Thanks, that helped a lot.", "What day comes after Tuesday?",
        "How many legs does a spider have?", "What is 9 times 6?", "Is water wet?", "Who is the author of Hamlet?",
        "What's the freezing point of water in Fahrenheit?", "Name three primary colours.",
        "What does CPU stand for?", "Which is bigger, 0.5 or 0.45?", "Can you tell me a joke?",
        "What is the square root of 81?", "yes or no: is the sun a star?", "How do I spell 'necessary'?",
        "What's the tallest mountain in the world?", "Who was the first person to walk on the moon?",
        "What language is spoken in Brazil?", "Give me one word that rhymes with 'cat'.",
        "Summarize in one word: the movie was long, boring and predictable.", "What is an adjective?",
    ],
    "complex": [
        "We're seeing churn rise among enterprise customers after the pricing change. Analyze possible causes, propose experiments to distinguish them, and recommend what to do first.",
        "Explain quantum entanglement to a high-school student, then explain it again at graduate level, and point out what the simple version gets wrong.",
        "Write a 1,000-word short story about a lighthouse keeper who discovers a message in a bottle, with a twist ending.",
        "Three friends split a bill unevenly: Ana pays twice what Ben pays, and Ben pays 15 more than Cai. The bill is 195. How much did each pay? Explain your reasoning.",
        "Draft a go-to-market strategy for a B2B analytics startup entering the European market, including pricing, channels and compliance.",
        "Our nightly batch jobs keep missing their deadline. Reason about scheduling, resource contention and data skew, and propose a migration plan.",
        "Is it ethical for companies to use employee monitoring software? Present several perspectives and conclude with your own reasoned view.",
        "Compare the economic policies of two historical periods of your choice and discuss what lessons apply today.",
        "Break down the problem of reducing hospital wait times into sub-problems and propose a solution for each.",
        "Summarize the key ideas of game theory, then apply them to a negotiation between two competing firms.",
        "Write a cover letter for a senior product manager role that ties my experience in logistics to the company's mission, and explain the structure you chose.",
        "Given a budget of $2M, how would you allocate spending between R&D, marketing and hiring for an early-stage company? Justify each choice and describe the risks.",
        "Why did the Roman Empire decline? Weigh the military, economic and political explanations against each other.",
        "Plan the rollout of a new internal tool to 5,000 employees across 12 countries: phases, training, feedback loops and success metrics.",
        "Reason carefully: if all bloops are razzies and some razzies are lazzies, does it follow that some bloops are lazzies? Explain why or why not.",
        "Create a detailed curriculum for a 12-week bootcamp on data engineering, with projects and assessment criteria for each module.",
        "What are the trade-offs between consistency and availability in distributed databases, and how should a bank and a social network choose differently?",
        "Rewrite our company values statement to be clearer and more inspiring, then explain how each value could be measured in practice.",
        "Analyze this situation: sales are up 20% but profit is down 5% year over year. What could explain it, and what data would you ask for?",
        "Develop a argument map for and against nuclear energy, then identify the crux where reasonable people disagree.",
    ],
    "code": [
        "def f(x): return x*2 -- why does f('3') return '33'?",
        "Write a Python decorator that retries a function three times with exponential backoff.",
        "How do I center a div with CSS?", "What is the difference between git merge and git rebase?",
        "Write a function to validate a Sudoku board.", "Convert this JSON to a TypeScript interface: {\"id\": 1, \"name\": \"x\", \"tags\": []}",
        "numpy: how do I reshape a (6,) array into (2,3)?", "Write a Go HTTP server that responds with 'ok' on /healthz.",
        "import pandas as pd\ndf = pd.read_csv('a.csv')\ndf.groupby('k').sum() -- why is column 'name' missing from the result?",
        "Implement binary search in C.", "How do I handle promises in a loop with async/await?",
        "Write a Kubernetes deployment YAML for an nginx container with 3 replicas.",
        "What does `yield` do in Python?", "Write a SQL migration that adds a non-null column with a default.",
        "Explain this error: error[E0382]: borrow of moved value: `v`", "Write a unit test for a function that adds two numbers.",
        "How do I make an HTTP POST request with curl and a JSON body?", "Write a Rust function that reads a file line by line.",
        "Why is my React useEffect running twice?", "Write a Makefile with build, test and clean targets.",
        "In Java, how do I sort a list of objects by a field?", "Write a shell script that checks if a port is open.",
    ],
}


def _fill(template: str, rng: random.Random) -> str:
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    return template.format(**{name: rng.choice(S[name]) for name in names})


def build() -> list[dict[str, str]]:
    rng = random.Random(7)
    rows: list[dict[str, str]] = []
    for label, templates in (("simple", SIMPLE), ("complex", COMPLEX), ("code", CODE)):
        for t, template in enumerate(templates):
            seen: set[str] = set()
            for _ in range(PER_TEMPLATE * 8):
                if len(seen) == PER_TEMPLATE:
                    break
                text = _fill(template, rng)
                if text not in seen:
                    seen.add(text)
                    rows.append({"text": text, "label": label, "group": f"{label}-t{t}"})
    n = 0
    for label, texts in HAND.items():
        for text in texts:
            rows.append({"text": text, "label": label, "group": f"hand-{n}"})
            n += 1
    return rows


def main() -> None:
    out = Path(__file__).with_name("intents.jsonl")
    rows = build()
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts = {label: sum(r["label"] == label for r in rows) for label in ("simple", "complex", "code")}
    print(f"wrote {len(rows)} prompts to {out}: {counts}")


if __name__ == "__main__":
    main()
