"""The words and sentences loadtest/pii_dataset.py builds its conversations from: names, places,
companies and products to fill slots with, and each kind of document's sentence templates, whose
slots say which fillers are gold PII.
"""

FIRST = (
    "James Maria Wei Priya Ahmed Olga Kenji Fatima Carlos Aisha Liam Sofia Dmitri Chloe Mateo "
    "Hannah Raj Emma Kwame Ingrid Diego Yuki Noah Elena Omar Lucas Amara Daniel Mei Samuel Zara "
    "Thomas Ana Ethan Leila Benjamin Nadia Victor Claire Tomasz Astrid Rahul Isabel Jonas Abena"
).split()
LAST = (
    "Garcia Zhang Patel Haddad Petrova Tanaka Okafor Rossi Nguyen Schmidt Kowalski Johansson "
    "O'Brien Murphy Silva Kim Cohen Dubois Mensah Fernandez Novak Yamamoto Walker Hughes Ibrahim "
    "Larsen Moreau Castillo Bennett Sato Kaur Reyes Fischer Adeyemi Costa Lindqvist Brennan Mwangi "
    "Alvarez Chen Whitaker Sorensen"
).split()
CITIES = (
    "Boston|Chicago|Denver|Seattle|Austin|Atlanta|Phoenix|Portland|San Diego|San Francisco|"
    "New York|Los Angeles|Toronto|Vancouver|London|Manchester|Dublin|Berlin|Munich|Paris|Lyon|"
    "Madrid|Barcelona|Lisbon|Amsterdam|Stockholm|Oslo|Warsaw|Prague|Vienna|Zurich|Milan|Rome|"
    "Tokyo|Osaka|Seoul|Singapore|Sydney|Melbourne|Mumbai|Bangalore|Nairobi|Lagos|Cairo|Dubai|"
    "Texas|Ohio|California|Germany|Brazil|Japan|Canada|Kenya|Poland"
).split("|")
COMPANIES = (
    "Acme Logistics|Globex|Initech|Umbrella Health|Northwind Traders|Contoso|Stark Freight|"
    "Wayne Biotech|Hooli|Vandelay Imports|Soylent Foods|Tyrell Systems|Cyberdyne Robotics|"
    "Pied Piper|Massive Dynamic|Oscorp Energy"
).split("|")
PRODUCTS = (
    "Kubernetes Postgres Redis Terraform Grafana Jira Salesforce Zendesk Slack Snowflake Kafka "
    "NATS Datadog Okta Stripe HubSpot Airflow Elasticsearch"
).split()
DOMAINS = ("gmail.com", "outlook.com", "proton.me", "yahoo.com")
DAYS = "Monday Tuesday Wednesday Thursday Friday".split()
MONTHS = "January February March April June July August September October November December".split()
AREA = (212, 206, 303, 312, 404, 415, 503, 512, 602, 617, 619, 646, 718, 720, 773, 917)

# Document sections. {P1}/{F1}/{E1}: the main person (full name / first name / email), {P2}...: a
# second one; {AGENT}: a staff name. Upper-case slots below the line are filler, never gold.
TICKET = [
    "Ticket #{N5} opened {DAY} by {P1} ({E1}), account {COMPANY}.",
    "Customer says the {PRODUCT} export has failed every night since the {VERSION} upgrade.",
    "They tried re-running the job manually at {TIME} UTC and got a 502 after about 40 seconds.",
    "{F1} asked for a callback on {PHONE} before {DAY} afternoon.",
    "Callback number on file: {PHONE}.",
    "Customer is based in {LOC} and works mostly in the evening, so please schedule accordingly.",
    "Previous agent {AGENT} offered a {PCT}% credit on invoice {INV}, which they have not accepted yet.",
    "Escalated to tier 2 because the same error appeared on order {ORDER} last month.",
    "Note from {AGENT}: the customer was polite but frustrated; this is the third contact this week.",
    "Attached logs show retries backing off to 64 seconds and then giving up.",
    "{F1} mentioned that {P2} from their finance team will join the next call.",
    "Please keep {E2} in copy on all replies about billing.",
]
INCIDENT = [
    "## Incident {INC}: elevated error rate on the {PRODUCT} gateway",
    "Start: {DATE} {TIME} UTC. Detected by the {PRODUCT} alert on p99 latency above 2 seconds.",
    "The first failing requests came from {IP}, which belongs to the batch ingestion fleet.",
    "Traffic from {IP} spiked to {N3} requests per second before the rate limiter engaged.",
    "{AGENT} rolled back to {VERSION} at {TIME} UTC and the error rate recovered within ten minutes.",
    "Root cause: a connection pool of 16 was shared by 48 workers after the {VERSION} config change.",
    "Customer impact: about {PCT}% of API calls returned 503 for 27 minutes.",
    "log: {DATE}T{TIME}Z ERROR pool-{N2} timeout acquiring connection (waited 30000 ms) req={HASH}",
    "log: {DATE}T{TIME}Z WARN upstream {IP}:8443 reset by peer after 1.2 MB",
    "Follow-up owner: {P1} ({E1}); review scheduled for {DAY}.",
    "Action items: add a saturation alert, cap workers per pool, and document the rollback in the runbook.",
    "The on-call engineer in {LOC} paged {F1} at {TIME}, who joined within five minutes.",
]
HR = [
    "New hire paperwork for {P1}, starting {DAY} {MONTH} {D} in the {LOC} office.",
    "Payroll needs the SSN {SSN} entered before the first pay run.",
    "Emergency contact: {P2}, phone {PHONE}.",
    "Personal email for onboarding documents: {E1}.",
    "Manager: {AGENT}. Team: platform reliability, level 4, remote-friendly.",
    "Equipment: laptop with 32 GB RAM, two monitors, and a {PRODUCT} license.",
    "Benefits enrollment closes 30 days after the start date; remind them in week two.",
    "Background check cleared on {DATE}; reference calls with {P2} and a former manager went well.",
    "Relocation stipend of {AMOUNT} approved because they are moving from {LOC2}.",
    "Their previous employer was {COMPANY}; no non-compete applies.",
]
BILLING = [
    "Billing dispute from {P1} <{E1}> regarding invoice {INV} for {AMOUNT}.",
    "They say card {CARD} was charged twice on {DATE}.",
    "Our records show one charge on the card ending in {N4} and one refund that is still pending.",
    "The customer asked us to switch future charges to {CARD} instead.",
    "Per policy, refunds above {AMOUNT} need approval from {AGENT}.",
    "Account tier: Enterprise, annual contract, renewal on {MONTH} {D}.",
    "{F1} can be reached at {PHONE} between 9 and 5 Eastern.",
    "The disputed amount includes {N3} seats that were removed in {MONTH}.",
    "Stripe event id {HASH} shows the retry came from the dunning job, not from a manual charge.",
]
CRM = [
    "Met {P1} from {COMPANY} at the {LOC} summit; they run {N3} agents on {PRODUCT}.",
    "Pain points: slow first response, no single view of tickets across {PRODUCT} and email.",
    "Budget owner is {P2}; procurement wants a security review before {MONTH}.",
    "Next step: demo on {DAY} with {F1} and two team leads; send the deck to {E1} beforehand.",
    "{F1} prefers calls to {PHONE} rather than email.",
    "Competitor in the deal: {COMPANY}; they were quoted {AMOUNT} per year.",
    "They are expanding to {LOC2} next quarter and will need data residency there.",
    "Champion: {F2}, who pushed for the pilot after the outage in {MONTH}.",
]
CODE = [
    "Why does this retry loop never stop when the server returns 429?",
    "```python\nasync def fetch(session, url, attempts=5):\n    for i in range(attempts):\n"
    "        async with session.get(url) as r:\n            if r.status != 429:\n"
    "                return await r.json()\n        await asyncio.sleep(2 ** i)\n```",
    "We run it under Python 3.11 with aiohttp {VERSION} inside {PRODUCT}.",
    "The container has 2 CPUs and 4 GB of memory; p95 latency went from 180 ms to 1.4 s.",
    "Also, is it safe to share one ClientSession across {N2} worker tasks?",
    "The deploy pipeline pins {PRODUCT} to {VERSION} and builds images tagged {HASH}.",
    "Our SLO is 99.9% over 30 days, measured at the load balancer.",
    "Config: max_connections=64, keepalive=30s, timeout=10s, retries=3.",
]
SYSTEM = [
    "You are Lane Assist, the support copilot for {COMPANY}.",
    "Answer in a friendly, concise tone; use bullet points for steps and never invent policy.",
    "Customers are mostly operations teams on the Enterprise and Growth plans.",
    "Refunds above {AMOUNT} must be escalated; credits up to {PCT}% may be offered by the agent.",
    "Business hours are 8:00 to 18:00 in each customer's time zone, {DAY} through Friday.",
    "Escalation contact for this workspace: {AGENT}.",
    "When a ticket mentions an outage, link the status page and ask for the request id.",
    "Do not include internal ticket numbers such as {INV} in customer-facing drafts.",
    "Prefer {PRODUCT} terminology the customer already uses; avoid jargon.",
    "If you are unsure, say so and suggest what information would resolve the question.",
    "Summaries should start with the customer's goal, then the blocker, then the next step.",
    "All drafts are reviewed by a human before sending; flag anything that needs legal review.",
]
REPLY = [
    "Here is a summary: the export job fails after the {VERSION} upgrade and {F1} wants a callback.",
    "Draft reply:\n\nHi {F1},\n\nThanks for your patience while we looked into this.",
    "We confirmed the root cause and a fix is scheduled for {DAY}.",
    "I suggest offering the {PCT}% credit again and confirming the refund timeline in writing.",
    "Next steps: 1) confirm the callback time, 2) attach the logs, 3) loop in {AGENT}.",
    "The rollback to {VERSION} looks like the right call; add an alert on pool saturation.",
    "Best regards,\n{AGENT}",
    "The retry loop never stops because the sleep is outside the response context; cap the attempts.",
]
FOLLOW = [
    "Can you make it shorter and mention that {P2} will join the call?",
    "Please also cc {E2} and keep the tone formal.",
    "Add that they can reach me directly at {PHONE}.",
    "Rewrite the summary for the weekly report, no names.",
    "What should we tell the customer in {LOC} about the maintenance window on {DAY}?",
    "Their new card is {CARD}; can you confirm the refund goes to the old one?",
    "The server {IP} is still failing health checks, what else should we check?",
    "Thanks, that works. Translate the draft into plain bullet points.",
    "Good. Now list the risks of moving the {PRODUCT} cluster to {VERSION} next {DAY}.",
    "HR asked me to double check the SSN {SSN}, is that format valid?",
]
GENERIC = [
    "The {PRODUCT} dashboard showed nothing unusual until {DAY} morning.",
    "We agreed to revisit the contract terms at the {MONTH} business review.",
    "Most of the backlog is low priority, but two items block the quarterly release.",
    "Latency improved by {PCT}% after the cache was moved closer to the database.",
    "The Growth plan includes 25 seats, SSO, and a 99.5% uptime commitment.",
    "Order {ORDER} shipped on {DATE} and was delivered two days late.",
    "A second opinion from the {COMPANY} integration team would help here.",
    "Weekly sync moved to Thursdays at 10:30 because of the new sprint cadence.",
    "Please keep the answer under 200 words and avoid promising dates we cannot meet.",
    "Version {VERSION} of the SDK deprecates the old pagination parameters.",
    "The audit found no gaps in access reviews, but two service accounts lack owners.",
    "Finance flagged {AMOUNT} of unbilled usage from the last quarter.",
    "Customer Success wants a one-page summary they can share with their VP.",
    "There are {N3} open tickets tagged billing and {N2} tagged outage this month.",
    "Use the Standard Operating Procedure for priority one incidents.",
    "Migration to {PRODUCT} is planned in three phases, each with a rollback point.",
]
DOCS = (TICKET, INCIDENT, HR, BILLING, CRM, CODE)
